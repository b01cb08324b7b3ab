#!/usr/bin/env bash
# Measures permd's CPU generators against a C Fisher–Yates, numpy and torch in one run and writes bench/results/cpu_gen.md.
# Usage: bash bench/cpu_gen.sh   (env: BUILD_DIR=build, REPS=5, SIZES="2^20+1 2^26+1 2^26",
#        PYTHON=/usr/bin/python3 (with numpy and torch), RESULTS_DIR=bench/results)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
reps=${REPS:-5}
sizes=${SIZES:-"2^20+1 2^26+1 2^26"}
python=${PYTHON:-/usr/bin/python3}
results=${RESULTS_DIR:-bench/results}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target cpu_gen -j "$(nproc)" >/dev/null

mkdir -p "$results"
raw=$results/cpu_gen.tsv # kept: the report can be rebuilt from it with bench/cpu_gen_report.py
echo "# measured $(date -u '+%Y-%m-%d %H:%M UTC')" >"$raw"
"$python" bench/cpu_gen_report.py --describe >>"$raw" # the machine, with its data: a rebuilt page keeps it
nargs=()
ints=()
for s in $sizes; do
  nargs+=(--n "$s")
  ints+=("$("$python" -c "import sys; s=sys.argv[1]; print(eval(s.replace('^', '**')))" "$s")")
done

"$build/bin/cpu_gen" "${nargs[@]}" --reps "$reps" --u64 | tee -a "$raw"
"$python" bench/cpu_gen_peers.py --reps "$reps" "${ints[@]}" | tee -a "$raw"
echo "# finished $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$raw"
. bench/pagelib.sh
kept=$(bench_kept "$results/cpu_gen.md") # hand-written sections survive a rerun
{
  "$python" bench/cpu_gen_report.py "$raw" "bash bench/cpu_gen.sh  (REPS=$reps SIZES=\"$sizes\"), tree $(bench_tree)"
  bench_append_kept "$kept"
} >"$results/cpu_gen.md.new"
mv "$results/cpu_gen.md.new" "$results/cpu_gen.md"
echo "wrote $results/cpu_gen.md" >&2
