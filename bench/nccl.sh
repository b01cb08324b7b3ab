#!/usr/bin/env bash
# NCCL delivery benchmark on a 2+ GPU machine: starts permd on GPU 0, runs bench/nccl as a trainer on GPU 1
# (and, with 3+ GPUs, a trainer on every other GPU at once), writes OUTPUT.md. usage: bench/nccl.sh BUILD_DIR OUTPUT.md [--quick]
set -euo pipefail
build=${1:?usage: bench/nccl.sh BUILD_DIR OUTPUT.md [--quick]}
out=${2:?}
shift 2
export NCCL_NVLS_ENABLE=0
. "$(dirname "$0")/pagelib.sh"
kept=$(bench_kept "$out") # hand-written sections survive a rerun
dir=$(mktemp -d)
"$build/bin/permd" --socket "$dir/permd.sock" --state-dir "$dir/state" --gpu-device 0 --max-count 16777216 \
  --log-level warn 2>"$dir/permd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [ -S "$dir/permd.sock" ] && break; sleep 0.05; done
tmp=$(mktemp)
"$build/bench/nccl" "$dir/permd.sock" "$@" >"$tmp" || { cat "$dir/permd.log" >&2; exit 1; }
# with 3+ GPUs, also every other GPU a trainer at once (7 at most)
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -ge 3 ]; then
  trainers=$((gpus - 1 < 7 ? gpus - 1 : 7))
  echo >>"$tmp"
  "$build/bench/nccl" "$dir/permd.sock" "$@" --trainers "$trainers" >>"$tmp" || { cat "$dir/permd.log" >&2; exit 1; }
fi
{
  echo "# NCCL delivery vs the socket path"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ *//' | tr '\n' ' ');" \
       "host CPU $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "- command: \`bench/nccl.sh $build $(basename "$out") $*\` (NCCL_NVLS_ENABLE=0), tree $(bench_tree)"
  echo "- each cell of the one-trainer table: the best of the timed requests (socket request, generation on permd's GPU,"
  echo "  transfer); of the table of several trainers: one round, all their ids over its wall time"
  echo
  cat "$tmp"
  bench_append_kept "$kept"
} >"$out.new"
mv "$out.new" "$out"
rm -f "$tmp"
cat "$out"
