#!/usr/bin/env bash
# Measures permd's CPU generators against a C Fisher–Yates, numpy and torch in one run and writes bench/results/cpu_gen.md.
# Usage: bash bench/cpu_gen.sh   (env: BUILD_DIR=build, REPS=5, SIZES="2^20+1 2^26+1 2^26")
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
reps=${REPS:-5}
sizes=${SIZES:-"2^20+1 2^26+1 2^26"}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target cpu_gen -j "$(nproc)" >/dev/null

mkdir -p bench/results
raw=bench/results/cpu_gen.tsv # kept: the report can be rebuilt from it with bench/cpu_gen_report.py
echo "# measured $(date -u '+%Y-%m-%d %H:%M UTC')" >"$raw"
nargs=()
ints=()
for s in $sizes; do
  nargs+=(--n "$s")
  ints+=("$(/usr/bin/python3 -c "import sys; s=sys.argv[1]; print(eval(s.replace('^', '**')))" "$s")")
done

"$build/bin/cpu_gen" "${nargs[@]}" --reps "$reps" --u64 | tee -a "$raw"
/usr/bin/python3 bench/cpu_gen_peers.py --reps "$reps" "${ints[@]}" | tee -a "$raw"
echo "# finished $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$raw"
/usr/bin/python3 bench/cpu_gen_report.py "$raw" "bash bench/cpu_gen.sh  (REPS=$reps SIZES=\"$sizes\")" >bench/results/cpu_gen.md
echo "wrote bench/results/cpu_gen.md" >&2
