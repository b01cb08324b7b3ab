#!/usr/bin/env bash
# Runs bench/mixtures (mixtures vs a flat dataset on the CPU) and writes bench/results/mixtures.md.
# usage: bench/mixtures.sh [BUILD_DIR] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=bench/results/mixtures.md
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$build/bench/mixtures" "$@" >"$tmp"
{
  echo "# Mixtures vs a flat dataset (CPU generation)"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "- command: \`bash bench/mixtures.sh $build $*\` (Release build)"
  echo "- timing: median of 5 runs after a warm-up, one thread; each mixture run reads a new mixture epoch"
  echo
  cat "$tmp"
  echo
  echo "A mixture id costs the block's slot (v1's f on log2 B bits under the block's packed keys), the"
  echo "component and draw of that slot (the weight tree), and the component's σ. With W ≤ 5 the fill is"
  echo "dense: every slot of the chunk's blocks and every draw of each component's contiguous range run"
  echo "on the SIMD kernels, and each read picks its own (W times the work, at full SIMD speed). With"
  echo "larger W it is sparse: slots on the per-lane-key kernel, one tree descent per read on exact"
  echo "multiply-shift divisions, and σ gathered at the reads' draws; the descent (a dependent chain"
  echo "of ⌈log2 C⌉ levels) is then most of the cost. Both are bit-identical to the core (test_cpu_mix)."
  echo "The flat rows are σ over N = the mixture's total size, the same rank's slice."
  echo
  echo "## Time to the first batch and memory, against what users build today"
  echo
  echo "\`PYTHONPATH=python PERMD_LIB=$build/lib/libpermd.so python3 bench/mixtures_peers.py ${PEER_LENGTHS:-1e7 1e8}\`"
  echo "(L = 10^9 is not run here: the numpy index alone would need 9 GB and its sort several times that.)"
  echo
  PYTHONPATH=python PERMD_LIB="$build/lib/libpermd.so" "${PYTHON:-/usr/bin/python3}" bench/mixtures_peers.py \
    ${PEER_LENGTHS:-1e7 1e8}
} >"$out"
cat "$out"
