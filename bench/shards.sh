#!/usr/bin/env bash
# Runs bench/shards (sharded ids vs flat σ per backend: the core, the CPU kernels, the GPU when built with CUDA)
# and bench/shards_peers.py (a rank's ids of a sharded epoch: permd against a materialized numpy window shuffle and
# torch's DistributedSampler; not with --gpu-only), and writes bench/results/shards.md (or $SHARDS_MD).
# usage: bench/shards.sh [BUILD_DIR] [--quick] [--gpu-only]   (PEER_SHARDS: shard counts for the peers, default
# "65536 1048576", 65536 alone with --quick; PYTHON: an interpreter with numpy and torch, default /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=${SHARDS_MD:-bench/results/shards.md}
tmp=$(mktemp)
trap 'rm -f "$tmp" "$out.new"' EXIT # a run cut short leaves the page as it was
. bench/pagelib.sh
"$build/bench/shards" "$@" >"$tmp"
peers=${PEER_SHARDS:-65536 1048576}
case " $* " in *" --quick "*) peers=${PEER_SHARDS:-65536} ;; esac
case " $* " in *" --gpu-only "*) peers= ;; esac
python=${PYTHON:-/usr/bin/python3}
kept=$(bench_kept "$out") # hand-written sections survive a rerun
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
{
  echo "# Sharded ids vs flat permutations"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores${gpu:+; $gpu}"
  echo "- command: \`bash bench/shards.sh $build $*\` (Release build), tree $(bench_tree)"
  echo "- timing: median of 5 runs after a warm-up, one thread (CPU); the generation alone into device memory (GPU)"
  echo
  cat "$tmp"
  echo
  echo "How the kernels work and what the figures mean: [docs/shards.md](../../docs/shards.md#speed)."
  if [ -n "$peers" ]; then
    echo
    echo "## A rank's ids of a sharded epoch, against what users build today"
    echo
    echo "\`PYTHONPATH=python PERMD_LIB=$build/lib/libpermd.so $python bench/shards_peers.py $peers\`: orders"
    echo "of one kind (shards shuffled, samples shuffled within windows of 8 shards) from permd and from a numpy"
    echo "build of all N ids (MosaicML streaming's py1b shuffles so), each rank taking its stride; and torch's"
    echo "DistributedSampler, the exact order trainers use today, which reads shards at random. Peers on one"
    echo "thread (OMP_NUM_THREADS=1), permd's CPU kernel on one thread. What each row measures, and why runs"
    echo "of seconds vary: bench/shards_peers.py's opening comment."
    echo
    PYTHONPATH=python PERMD_LIB="$build/lib/libpermd.so" "$python" bench/shards_peers.py $peers
  fi
  bench_append_kept "$kept"
} >"$out.new"
mv "$out.new" "$out"
cat "$out"
