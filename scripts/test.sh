#!/usr/bin/env bash
# Runs the whole test suite: the Release build (unit, quality, cli, integration, load, deploy), then the
# unit, integration and fuzz-corpus tests again under ASan+UBSan, then the unit tests under valgrind,
# then each libFuzzer target for FUZZ_SECONDS (60). Fails on any failure. PERMD_LONG_TESTS=1 runs the
# long variants (load 60 s per transport, 60 kill -9 rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

step() { printf '\n== %s\n' "$*"; }

step "module dependencies (no include cycle)"
python3 scripts/check-deps.py

step "build (Release, -Werror)"
bash scripts/build.sh

step "tests (Release)"
(cd build && ctest --output-on-failure -j"$jobs")

step "build (ASan+UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPERMD_SANITIZE=ON -DPERMD_WERROR=ON \
      -DPERMD_CUDA=OFF -DPERMD_BUILD_BENCH=OFF -DPERMD_IMPORT=ON >/dev/null
cmake --build build-asan -j"$jobs"

step "tests (ASan+UBSan)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -L 'unit|cli|integration|fuzz')

step "unit tests under valgrind (reduced sizes)"
# The SIMDe build of the AVX-512 kernel is skipped here: emulated vectors under valgrind take most of an
# hour and add nothing that its ASan+UBSan run above does not check.
for name in $(cd build && ctest -N -L unit | sed -n 's/^ *Test *#[0-9]*: //p' | grep -v '_avx512emu$'); do
  if ! log=$(PERMD_TEST_QUICK=1 valgrind -q --error-exitcode=99 --leak-check=full \
               --errors-for-leak-kinds=definite,indirect "build/bin/$name" 2>&1); then
    printf '%s\nvalgrind: %s failed\n' "$log" "$name" >&2
    exit 1
  fi
  echo "valgrind ok: $name"
done

step "fuzz (libFuzzer, ASan+UBSan, ${FUZZ_SECONDS:-60} s per target)"
bash scripts/fuzz.sh

step "all tests passed"
