#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) into build-fuzz/ and runs each for FUZZ_SECONDS (default 60)
# from the committed seeds; prints executions and crashes per target, and fails on any crash, leak or timeout.
# New corpus entries stay in build-fuzz/corpus/ (not committed); a crash leaves its reproducer in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"frame server http"}

CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DPERMD_FUZZ=ON -DPERMD_CUDA=OFF \
      -DPERMD_BUILD_BENCH=OFF >/dev/null
build_targets=()
for t in $targets; do build_targets+=(--target "fuzz_$t"); done
if ! cmake --build build-fuzz -j"$(nproc)" "${build_targets[@]}" >build-fuzz/build.log 2>&1; then
  tail -30 build-fuzz/build.log >&2
  exit 1
fi

summary=build-fuzz/summary.txt
: > "$summary"
status=0
for t in $targets; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  log=build-fuzz/fuzz_$t.log
  start=$(date +%s)
  rc=0
  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "bin/fuzz_$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
     -artifact_prefix="crash-$t-" "corpus/$t" "../tests/fuzz/corpus/$t") >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(find build-fuzz -maxdepth 1 -name "crash-$t-*" | wc -l)
  corpus=$(find "$work" -type f | wc -l)
  line="fuzz_$t seconds=$(( $(date +%s) - start )) execs=${execs:-0} crashes=$crashes exit=$rc corpus=$corpus"
  echo "$line" | tee -a "$summary"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    tail -40 "$log" >&2
    status=1
  fi
done
exit $status
