#!/usr/bin/env bash
# Mixture vs flat Fetch rates through one permd per pool setting (cpu_threads, cpu_spin_us): how the worker pool's
# size and polling serve small and large split requests on this host. Markdown on stdout (or into $OUT_MD).
#   usage: bench/pool_fetch.sh BUILD_DIR [THREADS:SPIN_US ...]   (default: one per CPU with 500 µs, and 8:500)
# Env: SECONDS_PER_RUN (2), ROUNDS (2; each round runs the names in the other order), CASES ("8:8192 1:8192 8:65536
# 1:65536", W:ids per Fetch). The mixture and flat dataset are bench/results/mixtures.md's (4 components 4:3:2:1).
set -euo pipefail
b=${1:?usage: bench/pool_fetch.sh BUILD_DIR [THREADS:SPIN_US ...]}
shift
cfgs=("$@")
[ ${#cfgs[@]} -gt 0 ] || cfgs=("$(nproc):500" "8:500")
secs=${SECONDS_PER_RUN:-2} rounds=${ROUNDS:-2} cases=${CASES:-"8:8192 1:8192 8:65536 1:65536"}
out=${OUT_MD:-/dev/stdout}
{
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
  echo "- command: \`bench/pool_fetch.sh $b ${cfgs[*]}\` (SECONDS_PER_RUN=$secs, ROUNDS=$rounds)"
  echo
  echo "| cpu_threads | cpu_spin_us | W | ids per Fetch | round | flat: Fetch/s | mixture: Fetch/s | mixture / flat |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$out"
for cfg in "${cfgs[@]}"; do
  th=${cfg%%:*} spin=${cfg##*:} t=$(mktemp -d)
  "$b/bin/permd" --socket "$t/s" --state-dir "$t/st" --metrics "" --log-level warn --cpu-threads "$th" \
    --cpu-spin-us "$spin" 2>"$t/log" &
  pid=$!
  for _ in $(seq 200); do [ -S "$t/s" ] && break; sleep 0.05; done
  ctl() { "$b/bin/permctl" "$@" --socket "$t/s" >/dev/null; }
  for c in 0:20000000 1:17000000 2:3000000 3:10000000; do ctl datasets put "part${c%%:*}" --size "${c##*:}"; done
  ctl datasets put flat --size 50000000
  ctl mixtures put mix --components part0,part1,part2,part3 --weights 4,3,2,1
  rate() { "$b/bench/serve" fetch --socket "$t/s" --dataset "$1" --world "$2" --count "$3" --seconds "$secs" |
             grep -o 'rps=[0-9]*' | cut -d= -f2; }
  for round in $(seq "$rounds"); do
    for wc in $cases; do
      w=${wc%%:*} n=${wc##*:}
      if [ $((round % 2)) = 1 ]; then f=$(rate flat "$w" "$n"); m=$(rate mix "$w" "$n")
      else m=$(rate mix "$w" "$n"); f=$(rate flat "$w" "$n"); fi
      echo "| $th | $spin | $w | $n | $round | $f | $m | $(awk -v m="$m" -v f="$f" 'BEGIN{printf "%.2f", m / f}') |" >>"$out"
    done
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$t"
done
