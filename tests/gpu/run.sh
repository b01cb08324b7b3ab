#!/usr/bin/env bash
# The GPU session's script, run on a GPU machine through the device tool (see docs): builds with CUDA,
# runs the GPU and unit tests, then the GPU benchmark, leaving logs and results in $OUT.
# Prepare here first: scripts/device-sysroot.sh (then carry .carry).
#   usage: tests/gpu/run.sh [tests|bench|cpubench|hostbench|serve|serve-compare|shards|shards-profile|mixtures|mixbench|nccl|nccl-python|python|all] [--quick]
# (python: the Python package's tests under this host's torch 2.x; CI runs them under Debian's torch 1.13)
# (shards: the sharded-id tests (GPU and CPU kernels against the core) and bench/shards.sh's CPU and GPU rows)
# (shards-profile: test_gpu_shards, ncu counters, SASS, the GPU rows, and those of build variants
#  (PD_SHARD_VARIANTS) or of an earlier tree carried in .bench-before, alternating with this one)
# (nccl: on 2+ GPUs, the delivery tests and bench/nccl.sh, and an earlier tree's bench carried in .bench-before,
#  alternating with this one)
# (mixtures: the mixture and CPU shard tests, bench/mixtures' CPU rows (--quick: shorter), and Fetches of two
#  mixtures (flat components; the first one sharded) and a flat dataset (FETCH_SECONDS each, default 3) on permd
#  with its pool of one thread and of one per CPU, and of an earlier tree's permd carried in .bench-before,
#  alternating)
# (mixbench: bench/mixtures.sh's whole page on this host's CPUs, into $OUT/mixtures.md; PEER_LENGTHS defaults
#  to 1e7 1e8 here, since the 10^9 peers take minutes; PERMD_TREE names the tree measured (a copy may carry a
#  stale .git); with FETCH_WORLDS' three W, SECONDS_PER_RUN=2 REPS=3 on a 16-core host passed `timeout 580` two
#  peer cases short (the peers alone take ~5 min of it): one device call fits the page with PEER_LENGTHS=1e7 or
#  REPS=2)
# (hostbench: serve, Python sampler and shard benchmarks on this host's many cores; needs redis in the
#  sysroot: scripts/device-sysroot.sh redis-server redis-tools libjemalloc2 liblzf1)
set -uo pipefail
what=${1:-all}
shift || true
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
sys=$PWD/.carry/sysroot
lib=$sys/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
export PATH=$sys/usr/bin:$PATH # protoc-c, pkg-config
export PKG_CONFIG_PATH=$lib/pkgconfig:$sys/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$sys
export NCCL_NVLS_ENABLE=0 # never NVLink multicast on shared machines
export PERMD_REQUIRE_GPU=1 # a GPU test that finds no GPU here fails (it skips in CI)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=ON -DPERMD_WERROR=ON \
      -DCMAKE_PREFIX_PATH="$sys/usr" ${PERMD_DEVICE_CMAKE_ARGS:-} >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-dev -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  grep -o -w 'avx512[a-z]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >"$OUT/cpu_flags.txt"
  # test_metrics needs Debian's python3-prometheus-client, which GPU machines lack
  (cd build-dev && ctest --output-on-failure -j4 -L 'gpu|unit|integration' -E test_metrics 2>&1) | tee "$OUT/tests.log" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$what" = python ]; then
  py=$(command -v python3)
  "$py" -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)' | tee "$OUT/python_tests.log"
  cmake -S . -B build-dev -DPERMD_PYTHON="$py" >>"$OUT/configure.log" 2>&1
  # install and readme build virtualenvs from Debian's /usr/bin/python3, which GPU hosts may lack
  (cd build-dev && ctest --output-on-failure -L python -E 'install|readme' 2>&1) | tee -a "$OUT/python_tests.log" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  bench/gpu_gen.sh build-dev "$OUT/gpu_gen.md" "$@" || rc=1
fi
if [ "$what" = nccl ] || [ "$what" = nccl-python ]; then # on 2+ GPUs: NCCL delivery tests and benchmark
  if [ "$what" = nccl ]; then
    (cd build-dev && ctest -V -R 'test_nccl|test_gpu_gen|test_backend' 2>&1) | tee "$OUT/nccl_tests.log" | tail -30
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  fi
  # A torch process carries its own NCCL, and every rank of a communicator must run the same NCCL:
  # give this permd torch's (docs/nccl.md).
  nccl_dir=$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
  echo "torch's NCCL: ${nccl_dir:-not found}" | tee "$OUT/nccl_python.log"
  d=$(mktemp -d)
  NCCL_DEBUG=WARN LD_LIBRARY_PATH=${nccl_dir:+$nccl_dir:}$LD_LIBRARY_PATH \
    build-dev/bin/permd --socket "$d/s" --state-dir "$d/st" --gpu-device 0 2>"$OUT/permd_py.log" &
  p=$!
  for _ in $(seq 100); do [ -S "$d/s" ] && break; sleep 0.1; done
  NCCL_DEBUG=WARN PYTHONPATH=python PERMD_LIB=build-dev/lib/libpermd.so python3 tests/gpu/test_nccl_python.py "$d/s" 2>&1 \
    | tee -a "$OUT/nccl_python.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  kill $p; wait $p
  [ "$what" = nccl-python ] || bench/nccl.sh build-dev "$OUT/nccl.md" "$@" || rc=1
  if [ "$what" = nccl ] && [ -f .bench-before/bench/nccl.sh ]; then # an earlier tree (carried): alternating with this one
    log=$(mktemp) # one file: the device tool returns at most 8
    { cmake -S .bench-before -B build-before -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=ON -DCMAKE_PREFIX_PATH="$sys/usr" \
        ${PERMD_DEVICE_CMAKE_ARGS:-} && cmake --build build-before -j"$(nproc)"; } >"$log" 2>&1 || { tail -20 "$log"; rc=1; }
    for round in 1 2; do for tree in before dev; do
      t=$(mktemp)
      if [ "$tree" = before ]; then .bench-before/bench/nccl.sh build-before "$t" "$@" >/dev/null || rc=1
      else bench/nccl.sh build-dev "$t" "$@" >/dev/null || rc=1; fi
      { echo "## round $round: $([ "$tree" = before ] && echo 'the earlier tree' || echo 'this tree')"; cat "$t"; echo; } \
        >>"$OUT/nccl_compare.md"
    done; done
  fi
fi
if [ "$what" = cpubench ]; then # the CPU benchmark on this host's CPUs (AVX-512, many cores)
  BUILD_DIR=build-dev PYTHON=python3 RESULTS_DIR="$OUT" bash bench/cpu_gen.sh || rc=1
fi
if [ "$what" = hostbench ] || [ "$what" = serve ]; then # CPU-side benchmarks that want more cores than a CI machine has
  OUT="$OUT/serve.md" REPS=3 bash bench/serve.sh build-dev 2>&1 | tail -30 || rc=1
fi
if [ "$what" = shards ]; then
  (cd build-dev && ctest --output-on-failure -R '^(test_gpu_shards|test_cpu_shards|test_shards|test_backend)$' 2>&1) \
    | tee "$OUT/shards_tests.log" | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$what" = hostbench ] || [ "$what" = shards ]; then
  SHARDS_MD="$OUT/shards.md" bash bench/shards.sh build-dev "$@" >"$OUT/shards_bench.log" 2>&1 || { tail -20 "$OUT/shards_bench.log"; rc=1; }
fi
if [ "$what" = shards-profile ]; then # where the sharded kernels' time goes: tests, ncu counters, SASS, build variants
  (cd build-dev && ctest --output-on-failure -R '^test_gpu_shards$' 2>&1) >"$OUT/shards_tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  tail -5 "$OUT/shards_tests.log"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  prof=$(mktemp -d) # SASS, source counters and sections: one archive (the device tool returns few files)
  cuobjdump --dump-sass build-dev/lib/libpermd_gpu.so 2>/dev/null \
    | awk '/Function :/{keep = /shard_tiles|walk_segment|walk_refill|walk_naive/} keep' | gzip >"$prof/shards_sass.txt.gz"
  metrics=gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
  metrics=$metrics,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
  metrics=$metrics,smsp__thread_inst_executed_per_inst_executed.ratio,launch__registers_per_thread,launch__grid_size
  metrics=$metrics,smsp__inst_executed_op_local_ld.sum,smsp__inst_executed_op_local_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
  # PD_SHARD_NCU=0: not these counters over every launch (PD_SHARD_SOURCE's still run)
  [ -n "$ncu_bin" ] && [ "${PD_SHARD_NCU:-1}" != 0 ] && "$ncu_bin" --clock-control none -k 'regex:shard_|walk_' --metrics "$metrics" --csv \
    build-dev/bench/shards --gpu-only >"$OUT/shards_ncu.csv" 2>&1
  # PD_SHARD_SOURCE: per-instruction counts of shard_tiles launches, by index (-s), one file each; with
  # bench/shards --gpu-only's 6 launches a row (a warm-up, then 5), 8 rows a table: uneven K = 1, G = 1 is 49
  # (-s counts shard_tiles launches alone)
  for s in ${PD_SHARD_SOURCE:-}; do
    [ -n "$ncu_bin" ] || break
    "$ncu_bin" --clock-control none -k regex:shard_tiles -s "$s" -c 1 --section SourceCounters \
      --page source --print-source sass --csv build-dev/bench/shards --gpu-only 2>&1 | gzip >"$prof/shards_source_$s.csv.gz"
    "$ncu_bin" --clock-control none -k regex:shard_tiles -s "$s" -c 1 --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy --section LaunchStats \
      --print-details all build-dev/bench/shards --gpu-only >"$prof/shards_sections_$s.txt" 2>&1
  done
  tar -C "$prof" -czf "$OUT/shards_profile.tar.gz" .
  rm -rf "$prof"
  build-dev/bench/shards --gpu-only >"$OUT/shards_gpu_base.md" 2>&1 || rc=1
  if [ -f .bench-before/bench/shards.c ]; then # an earlier tree (git archive, carried): its GPU rows, then this tree's again
    { cmake -S .bench-before -B build-before -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=ON -DCMAKE_PREFIX_PATH="$sys/usr" \
        ${PERMD_DEVICE_CMAKE_ARGS:-} && cmake --build build-before -j"$(nproc)" --target bench_shards; } \
      >"$OUT/before_build.log" 2>&1 || { tail -20 "$OUT/before_build.log"; rc=1; }
    for round in 1 2; do
      build-before/bench/shards --gpu-only >"$OUT/shards_gpu_before_$round.md" 2>&1 || rc=1
      build-dev/bench/shards --gpu-only >"$OUT/shards_gpu_after_$round.md" 2>&1 || rc=1
    done
  fi
  built=""
  for v in ${PD_SHARD_VARIANTS:-}; do # NAME=CUDA_FLAGS, commas for spaces, e.g. mb4=-DPD_GPU_SHARD_MIN_BLOCKS=4
    mkdir -p "build-${v%%=*}"
    { cmake -S . -B "build-${v%%=*}" -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=ON -DCMAKE_PREFIX_PATH="$sys/usr" ${PERMD_DEVICE_CMAKE_ARGS:-} \
        "-DCMAKE_CUDA_FLAGS=$(echo "${v#*=}" | tr , ' ')" && cmake --build "build-${v%%=*}" -j"$(nproc)" --target bench_shards; } \
      >"build-${v%%=*}/variant.log" 2>&1 || { tail -20 "build-${v%%=*}/variant.log" >>"$OUT/shards_gpu_variants.md"; rc=1; continue; }
    built="$built $v"
  done
  for round in 1 2; do # this tree and each variant, alternating, twice
    [ -n "$built" ] || break
    { echo "## round $round: this tree"; build-dev/bench/shards --gpu-only; } >>"$OUT/shards_gpu_variants.md" 2>&1 || rc=1
    for v in $built; do
      { echo "## round $round: variant ${v%%=*}: ${v#*=}"; "build-${v%%=*}/bench/shards" --gpu-only; } \
        >>"$OUT/shards_gpu_variants.md" 2>&1 || rc=1
    done
  done
fi
if [ "$what" = mixtures ]; then
  # the Python ones need the python mode's interpreter (torch, numpy): CI runs them
  (cd build-dev && ctest --output-on-failure -L 'unit|integration|cli|quality' -R 'mix|readahead|cpu_shards' 2>&1) | tee "$OUT/mixtures_tests.log" | tail -12
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  build-dev/bench/mixtures "$@" >"$OUT/mixtures_cpu.md" || rc=1 # --quick: shorter runs
  trees="this=build-dev/bin/permd"
  if [ -f .bench-before/bench/mixtures.sh ]; then # an earlier tree, carried: its permd (CPU only) alternates with this one
    (cd .bench-before && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=OFF \
       -DCMAKE_PREFIX_PATH="$sys/usr" && cmake --build build -j"$(nproc)" --target permd) >"$OUT/before_build.log" 2>&1 \
      && trees="before=.bench-before/build/bin/permd $trees $trees before=.bench-before/build/bin/permd"
  fi
  for tree in $trees; do for threads in 1 0; do
    d=$(mktemp -d)
    "${tree#*=}" --socket "$d/s" --state-dir "$d/st" --metrics "" --log-level warn --cpu-threads "$threads" 2>"$d/log" &
    p=$!
    for _ in $(seq 100); do [ -S "$d/s" ] && break; sleep 0.1; done
    for c in 0:20000000 1:17000000 2:3000000 3:10000000; do
      build-dev/bin/permctl datasets put "part${c%%:*}" --size "${c##*:}" --socket "$d/s" >/dev/null
    done
    build-dev/bin/permctl datasets put flat --size 50000000 --socket "$d/s" >/dev/null
    build-dev/bin/permctl mixtures put mix --components part0,part1,part2,part3 --weights 4,3,2,1 --socket "$d/s" >/dev/null
    # mixsh: bench/mixtures.sh's, the first component sharded (10,000 shards of 1000-3000 samples)
    awk 'BEGIN { for (i = 0; i < 10000; i++) print 1000 + (i * 7919) % 2001 }' >"$d/shards"
    build-dev/bin/permctl datasets put part0sh --shards-file "$d/shards" --socket "$d/s" >/dev/null
    build-dev/bin/permctl mixtures put mixsh --components part0sh,part1,part2,part3 --weights 4,3,2,1 --socket "$d/s" \
      >/dev/null
    for count in 8192 65536; do
      for world in 1 8; do
        for name in flat mix mixsh; do
          echo "tree=${tree%%=*} cpu_threads=$threads dataset=$name $(build-dev/bench/serve fetch --socket "$d/s" \
            --dataset $name --world $world --count $count --seconds "${FETCH_SECONDS:-3}")" >>"$OUT/mixtures_pool.txt"
        done
      done
    done
    kill $p; wait $p; rm -rf "$d"
  done; done
  cat "$OUT/mixtures_pool.txt"
fi
if [ "$what" = mixbench ]; then
  OUT="$OUT/mixtures.md" PYTHON=python3 PEER_LENGTHS=${PEER_LENGTHS:-1e7 1e8} bash bench/mixtures.sh build-dev "$@" \
    >/dev/null 2>"$OUT/mixbench.err" || { tail -20 "$OUT/mixbench.err"; rc=1; }
fi
if [ "$what" = serve-compare ]; then # bench/serve.sh of an earlier tree and of this one, alternating, same host
  # .bench-before: `git archive <commit>` unpacked there and carried (e.g. the commit before a refactor)
  [ -f .bench-before/bench/serve.sh ] || { echo "serve-compare: carry .bench-before (an earlier tree)" >&2; exit 2; }
  (cd .bench-before && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=OFF \
     -DCMAKE_PREFIX_PATH="$sys/usr" && cmake --build build -j"$(nproc)") >"$OUT/before_build.log" 2>&1 \
    || { tail -20 "$OUT/before_build.log"; exit 1; }
  # permd of both trees built the same way (no CUDA: the serve rows are the CPU backend's)
  cmake -S . -B build-cpu -DCMAKE_BUILD_TYPE=Release -DPERMD_CUDA=OFF -DCMAKE_PREFIX_PATH="$sys/usr" \
    >"$OUT/cpu_build.log" 2>&1 && cmake --build build-cpu -j"$(nproc)" >>"$OUT/cpu_build.log" 2>&1 \
    || { tail -20 "$OUT/cpu_build.log"; exit 1; }
  for round in 1 2; do
    OUT="$OUT/serve_before_$round.md" REPS=${REPS:-2} SECONDS_PER_RUN=${SECONDS_PER_RUN:-3} bash .bench-before/bench/serve.sh .bench-before/build 2>&1 | tail -3 || rc=1
    OUT="$OUT/serve_after_$round.md" REPS=${REPS:-2} SECONDS_PER_RUN=${SECONDS_PER_RUN:-3} bash bench/serve.sh build-cpu 2>&1 | tail -3 || rc=1
  done
fi
if [ "$what" = hostbench ]; then
  PYTHONPATH=python PERMD_LIB=build-dev/lib/libpermd.so python3 bench/python_sampler.py "$OUT/python.md" 2>&1 | tail -20 || rc=1
fi
exit $rc
