#!/usr/bin/env bash
# Runs bench/shards (sharded ids vs flat σ per backend: the core, the CPU kernels, the GPU when built with CUDA)
# and writes bench/results/shards.md (or $SHARDS_MD).
# usage: bench/shards.sh [BUILD_DIR] [--quick] [--gpu-only]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=${SHARDS_MD:-bench/results/shards.md}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
. bench/pagelib.sh
"$build/bench/shards" "$@" >"$tmp"
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
  bench_append_kept "$kept"
} >"$out.new"
mv "$out.new" "$out"
cat "$out"
