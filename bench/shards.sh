#!/usr/bin/env bash
# Runs bench/shards (sharded plans vs flat σ on the CPU) and writes bench/results/shards.md.
# usage: bench/shards.sh [BUILD_DIR] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=bench/results/shards.md
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$build/bench/shards" "$@" >"$tmp"
{
  echo "# Sharded plans vs flat permutations (CPU)"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "- command: \`bash bench/shards.sh $build $*\` (Release build)"
  echo "- timing: median of 5 runs after a warm-up, one thread"
  echo
  cat "$tmp"
  echo
  echo "A sharded id costs two binary searches over the per-epoch slot table plus σ of the window"
  echo "(scalar); the flat rows are the same rank's slice from σ alone. The plan build is the O(S)"
  echo "per-epoch table (shard order and prefix sums) that the daemon caches per (dataset, seed,"
  echo "epoch, K, G). On the GPU (gpu/shards.cu) each thread runs the core's inline kernels for one"
  echo "position on a device copy of the plan's tables; the upload is 24 bytes per shard, once per"
  echo "plan (the daemon keeps its last few plans on the device)."
} >"$out"
cat "$out"
