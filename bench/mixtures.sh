#!/usr/bin/env bash
# Writes bench/results/mixtures.md from one run: bench/mixtures (mixtures vs a flat dataset on the CPU, no
# daemon), Fetch through a permd daemon of a mixture's name vs a flat dataset's (bench/serve fetch, interleaved
# rounds, the best of each), and bench/mixtures_peers.py (first batch and memory against a numpy Megatron-style
# blended index and torch's WeightedRandomSampler, at L = 10^7, 10^8, 10^9 unless PEER_LENGTHS says otherwise).
# Sections of the page from a heading that says "(by hand" are kept below the new tables.
# usage: bench/mixtures.sh [BUILD_DIR] [--quick]   (SECONDS_PER_RUN=3, REPS=5, FETCH_WORLDS="1 8 64", PEER_MEM_GIB=20,
#   OUT=bench/results/mixtures.md)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=${OUT:-bench/results/mixtures.md}
. bench/pagelib.sh
tree=$(bench_tree)
run_s=${SECONDS_PER_RUN:-3}
reps=${REPS:-5}
read -ra worlds <<<"${FETCH_WORLDS:-1 8 64}" # W = 64 = B: every read of a rank in its own block, the costliest case
lengths=${PEER_LENGTHS:-1e7 1e8 1e9}
for tool in "$build/bench/mixtures" "$build/bench/serve" "$build/bin/permd" "$build/bin/permctl"; do
  [ -x "$tool" ] || { echo "mixtures.sh: build first: $tool" >&2; exit 2; }
done
load=$(cut -d' ' -f1-3 /proc/loadavg) # before anything of ours runs
tmp=$(mktemp -d /tmp/permd-mixbench-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

"$build/bench/mixtures" "$@" >"$tmp/cpu"

# The daemon: the mixture of bench/mixtures (4 components, weights 4:3:2:1, L = N) and a flat dataset of N.
"$build/bin/permd" --socket "$tmp/permd.sock" --state-dir "$tmp/state" --metrics "" --log-level warn \
  2>"$tmp/permd.log" &
pid=$!
for _ in $(seq 200); do [ -S "$tmp/permd.sock" ] && break; sleep 0.05; done
[ -S "$tmp/permd.sock" ] || { echo "mixtures.sh: permd did not start" >&2; cat "$tmp/permd.log" >&2; exit 1; }
ctl() { "$build/bin/permctl" "$@" --socket "$tmp/permd.sock" >/dev/null; }
names=()
for c in 0:20000000 1:17000000 2:3000000 3:10000000; do
  ctl datasets put "part${c%%:*}" --size "${c##*:}"
  names+=("part${c%%:*}")
done
ctl datasets put flat --size 50000000
ctl mixtures put mix --components "$(IFS=,; echo "${names[*]}")" --weights 4,3,2,1
# The same with its first component sharded: 10,000 shards of 1000-3000 samples (20,003,725 in all).
awk 'BEGIN { for (i = 0; i < 10000; i++) print 1000 + (i * 7919) % 2001 }' >"$tmp/shards"
ctl datasets put part0sh --shards-file "$tmp/shards"
ctl mixtures put mixsh --components "part0sh,$(IFS=,; echo "${names[*]:1}")" --weights 4,3,2,1

kv() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }
declare -A V
for rep in $(seq "$reps"); do # rounds interleave the names, so other load hits them alike
  order="flat mix mixsh"
  [ $((rep % 2)) = 0 ] && order="mixsh mix flat" # and alternate which goes first
  for count in 1024 8192 65536; do
    for world in "${worlds[@]}"; do
      for name in $order; do
        line=$("$build/bench/serve" fetch --socket "$tmp/permd.sock" --dataset "$name" --world "$world" \
          --count "$count" --seconds "$run_s")
        V[$name.$count.$world]+="$(kv "$line" rps) $(kv "$line" p50_us) $(kv "$line" p99_us);"
      done
    done
  done
done
best() { tr ';' '\n' <<<"$1" | sed '/^$/d' | sort -g -k1,1 | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; } # a / b, two decimals
kept=$(bench_kept "$out") # hand-written sections survive a rerun

{
  echo "# Mixtures vs a flat dataset, and against what users build today"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(awk '/^MemTotal/ {printf "%.0f GiB", $2 / 2^20}' /proc/meminfo);"
  echo "  load average before the run $load (other jobs share these cores: compare rows of this run only)"
  echo "- command: \`bash bench/mixtures.sh $build $*\` (Release build; SECONDS_PER_RUN=$run_s, REPS=$reps, FETCH_WORLDS=\"${worlds[*]}\", PEER_LENGTHS=\"$lengths\"), tree $tree"
  echo
  echo "## CPU generation (no daemon)"
  echo
  echo "Median of 5 runs after a warm-up, one thread; each mixture run reads a new mixture epoch."
  echo
  cat "$tmp/cpu"
  echo
  echo "A mixture id costs the block's slot (v1's f on log2 B bits under the block's packed keys), the"
  echo "component and draw of that slot (the weight tree), and the component's σ. Slots: for small W"
  echo "(B ≤ 256; W = 1 with AVX-512 VBMI, W ≤ 4 without it and on AVX2) every slot of 8 blocks at once,"
  echo "one byte per slot, a round a vpermb and an xor (VBMI) or a pshufb and six more, one Philox per"
  echo "block; otherwise each read keyed by its block (VBMI: bytes, 64 reads a register, one Philox per"
  echo "block; AVX2: bytes, 32 reads a register, one Philox per block where they lie in 8 blocks)"
  echo "or the core. Components and draws (C ≤ 64): every component's count at each block boundary, 32"
  echo "blocks at once, and (C ≤ 16, reads dense enough) each read's component among those 32 blocks by one"
  echo "compare per component, nothing per block; else a walk of the tree per block or a descent per read. With W = 1 the fill is"
  echo "dense: every draw of each component's contiguous range runs on the σ kernel and each read picks its"
  echo "own; with larger W it is sparse: σ of the reads in read order on the batch kernel, every lane on its"
  echo "component's keys (AVX-512, flat components of 2 to 2^32 samples: these rows), or gathered by"
  echo "component and scattered back (AVX2). All bit-identical to the core (test_cpu_mix)."
  echo "The flat rows are σ over N = the mixture's total size, the same rank's slice; the avx2 rows run"
  echo "the AVX2 kernels on the same CPU."
  echo
  echo "## Fetch through the daemon: a mixture's name vs a flat dataset's"
  echo
  echo "One permd (default config, private Unix socket); \`bench/serve fetch --dataset NAME --world W --count C\`:"
  echo "one client, each Fetch asks rank 0 of W for C u32 ids (pad mode) at a new offset. \`mix\` is the"
  echo "mixture above (4 components, 4:3:2:1, L = N = 5·10^7), \`flat\` a dataset of N = 5·10^7. Each row is"
  echo "the fastest of $reps interleaved rounds of ${run_s} s (each round runs the names in the other order). Two ratios: of the Fetch rates, and of the median"
  echo "latencies (flat p50 / mixture p50), which a burst of other work on these cores moves less."
  if [[ " ${worlds[*]} " == *" 64 "* ]]; then
    echo "With W = 64, the mixture's B, each of a rank's reads lies in its own block and pays that block's Philox,"
    echo "slot and counts alone: the costliest case of a mixture id (the CPU table's W = 64 rows)."
  fi
  echo
  echo "| W | ids per Fetch | flat: Fetch/s | flat p50 µs | mixture: Fetch/s | mixture p50 µs | mixture p99 µs | mixture / flat (rate) | mixture / flat (p50) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for count in 1024 8192 65536; do
    for world in "${worlds[@]}"; do
      read -r fr fp50 _ <<<"$(best "${V[flat.$count.$world]}")"
      read -r mr mp50 mp99 <<<"$(best "${V[mix.$count.$world]}")"
      echo "| $world | $count | $fr | $fp50 | $mr | $mp50 | $mp99 | $(ratio "$mr" "$fr") | $(ratio "$fp50" "$mp50") |"
    done
  done
  echo
  echo "\`mixsh\` is \`mix\` with its first component a sharded dataset of about its size (20,003,725 samples"
  echo "in 10,000 shards of 1000-3000, default window and lanes), in the same rounds:"
  echo
  echo "| W | ids per Fetch | flat: Fetch/s | mixsh: Fetch/s | mixsh p50 µs | mixsh p99 µs | mixsh / flat (rate) | mixsh / mix (rate) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  for count in 1024 8192 65536; do
    for world in "${worlds[@]}"; do
      read -r fr _ _ <<<"$(best "${V[flat.$count.$world]}")"
      read -r mr _ _ <<<"$(best "${V[mix.$count.$world]}")"
      read -r sr sp50 sp99 <<<"$(best "${V[mixsh.$count.$world]}")"
      echo "| $world | $count | $fr | $sr | $sp50 | $sp99 | $(ratio "$sr" "$fr") | $(ratio "$sr" "$mr") |"
    done
  done
  echo
  echo "## Time to the first batch and memory, against what users build today"
  echo
  echo "\`PYTHONPATH=python PERMD_LIB=$build/lib/libpermd.so PERMD_SOCKET=... ${PYTHON:-/usr/bin/python3} bench/mixtures_peers.py $lengths\`"
  echo "(the daemon row uses the permd above)"
  echo
  PYTHONPATH=python PERMD_LIB="$build/lib/libpermd.so" PERMD_SOCKET="$tmp/permd.sock" \
    "${PYTHON:-/usr/bin/python3}" bench/mixtures_peers.py $lengths
  bench_append_kept "$kept"
} >"$out.new"
mv "$out.new" "$out"
cat "$out"
