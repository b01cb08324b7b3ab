#!/usr/bin/env bash
# Runs the GPU benchmark (bench/gpu_gen.cu, then torch.randperm) and writes a results page.
# usage: bench/gpu_gen.sh BUILD_DIR OUTPUT.md [--quick]
set -euo pipefail
build=${1:?usage: bench/gpu_gen.sh BUILD_DIR OUTPUT.md [--quick]}
out=${2:?usage: bench/gpu_gen.sh BUILD_DIR OUTPUT.md [--quick]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pagelib.sh"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

"$build/bin/gpu_gen" "$@" >"$tmp"
python3 "$here/gpu_peers.py" "$tmp" >>"$tmp" 2>&1 || echo "(torch.randperm: not available: $(tail -1 "$tmp"))" >>"$tmp"
kept=$(bench_kept "$out") # hand-written sections survive a rerun

{
  echo "# GPU generation benchmark"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1);" \
       "host CPU $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "- command: \`bench/gpu_gen.sh $build $(basename "$out") $*\` (built with \`-DPERMD_CUDA=ON\`, Release), tree $(bench_tree)"
  echo "- timing: CUDA events, median of 5 runs after a warm-up; thrust and CUB from CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo
  cat "$tmp"
  bench_append_kept "$kept"
} >"$out.new"
mv "$out.new" "$out"
cat "$out"
