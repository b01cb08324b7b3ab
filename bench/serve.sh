#!/usr/bin/env bash
# bench/serve.sh: permd Fetch and Stream against Redis GET, same machine, same run; writes bench/results/serve.md.
#
#   bench/serve.sh [BUILD_DIR]   (default: build; SECONDS_PER_RUN=5, REPS=3, OUT=bench/results/serve.md)
#
# Redis (Debian redis-server) and permd each get a private Unix socket in a
# temporary directory. Redis: redis-benchmark GET of one 4 KiB value at 1 and
# 32 clients, and at 32 clients also a second Redis with I/O threads (as many
# as permd's loops) driven by a multi-threaded redis-benchmark; the ratios take
# the faster Redis. permd (its GPU off: these rows are the CPU backend's):
# bench/serve (built on libpermd) Fetch of 1024 u32 ids (4 KiB) at 1 and 32
# clients, each client reading its slice in order, and the same at random
# offsets (no readahead) and over n = 2^31 + 1 (every position cycle-walks, the
# worst case); and one Stream's ids/s through its shared-memory ring (libpermd's
# default on a Unix socket) and through the socket, beside what a bare Unix
# socket moves (the socket transport's ceiling). Sections of OUT from a heading
# that says "(by hand" on are kept below the new tables.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
RUN_S=${SECONDS_PER_RUN:-5}
OUT=${OUT:-$ROOT/bench/results/serve.md}
PERMD="$BUILD/bin/permd"
PERMCTL="$BUILD/bin/permctl"
SERVE="$BUILD/bench/serve"
for tool in "$PERMD" "$PERMCTL" "$SERVE"; do [ -x "$tool" ] || { echo "serve.sh: build first: $tool" >&2; exit 2; }; done
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
  { echo "serve.sh: needs redis-server and redis-benchmark (scripts/install-deps.sh)" >&2; exit 2; }

LOAD=$(cut -d' ' -f1-3 /proc/loadavg) # before anything of ours runs
. "$ROOT/bench/pagelib.sh"
TREE=$(bench_tree)
NCPU=$(nproc)
LOOPS=$((NCPU < 4 ? NCPU : 4)) # permd's default loops (min(CPUs, 4)): Redis gets as many I/O threads
BUSY=$(ps -eo pcpu=,comm= --sort=-pcpu | awk 'NR == 1 {printf "%s at %s%% CPU", $2, $1}')
TMP=$(mktemp -d /tmp/permd-bench-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

wait_socket() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "serve.sh: no $1" >&2; exit 1; }

# redis.sock: Redis as configured by default (one I/O thread); redis-mt.sock: with permd's loop count in I/O threads.
redis-server --port 0 --unixsocket "$TMP/redis.sock" --unixsocketperm 700 --save "" --appendonly no \
  --daemonize no --loglevel warning >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
redis-server --port 0 --unixsocket "$TMP/redis-mt.sock" --unixsocketperm 700 --save "" --appendonly no \
  --io-threads "$LOOPS" --io-threads-do-reads yes --daemonize no --loglevel warning >"$TMP/redis-mt.log" 2>&1 &
PIDS+=($!)
"$PERMD" --socket "$TMP/permd.sock" --state-dir "$TMP/state" --log-level warn --gpu off 2>"$TMP/permd.log" &
PIDS+=($!)
wait_socket "$TMP/redis.sock"
wait_socket "$TMP/redis-mt.sock"
wait_socket "$TMP/permd.sock"

# Redis: one 4 KiB value under the key redis-benchmark's GET reads ("key:__rand_int__" without -r).
for sock in redis redis-mt; do
  redis-benchmark -s "$TMP/$sock.sock" -t set -d 4096 -n 1 -c 1 -q >/dev/null
  [ "$(redis-cli -s "$TMP/$sock.sock" STRLEN key:__rand_int__)" = 4096 ] || { echo "serve.sh: redis value missing" >&2; exit 1; }
done

# redis_get SOCKET CLIENTS [THREADS] -> "rps p50_us p99_us"; the request count is sized for about RUN_S seconds.
redis_get() {
  local sock=$1 c=$2 probe n threads=()
  [ -n "${3:-}" ] && threads=(--threads "$3")
  probe=$(redis-benchmark -s "$TMP/$sock.sock" -t get -c "$c" -n 20000 "${threads[@]}" --csv | awk -F'"' '/^"GET"/{print $4}')
  n=$(awk -v r="$probe" -v s="$RUN_S" 'BEGIN{printf "%d", r * s}')
  redis-benchmark -s "$TMP/$sock.sock" -t get -c "$c" -n "$n" "${threads[@]}" --csv |
    awk -F'"' '/^"GET"/{printf "%.0f %.1f %.1f\n", $4, $10 * 1000, $14 * 1000}'
}

# kv LINE KEY -> value of KEY=value in a serve output line.
kv() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }

"$PERMCTL" datasets put bench --size 4294967296 --socket "$TMP/permd.sock" >/dev/null
"$PERMCTL" datasets put odd --size 2147483649 --socket "$TMP/permd.sock" >/dev/null # 2^31 + 1: σ walks ~2× per id

# REPS rounds, each running every workload once, interleaved; each cell is
# the round with the highest rate (other work on the machine only slows a
# run down, so the best round is the least disturbed one, for both peers).
REPS=${REPS:-3}
declare -A V
# fetch_row KEY CLIENTS ARGS...: one bench/serve fetch run, its "rps p50 p99" appended to V[KEY_CLIENTS].
fetch_row() {
  local k=$1 c=$2 line
  shift 2
  line=$("$SERVE" fetch --socket "$TMP/permd.sock" --clients "$c" --seconds "$RUN_S" "$@")
  V[${k}_$c]+="$(kv "$line" rps) $(kv "$line" p50_us) $(kv "$line" p99_us);"
}
RT=$((NCPU < 32 ? NCPU : 32)) # redis-benchmark's threads at 32 clients: bench/serve runs a thread per client
for rep in $(seq "$REPS"); do
  for c in 1 32; do
    V[redis_$c]+="$(redis_get redis "$c");"
    [ "$c" = 32 ] && V[redismt_$c]+="$(redis_get redis-mt "$c" "$RT");"
    fetch_row permd "$c" --dataset bench --count 1024
    fetch_row small "$c" --dataset bench --count 16
    fetch_row random "$c" --dataset bench --count 1024 --offsets random
    fetch_row odd "$c" --dataset odd --count 1024
  done
done
# Fetch at 1 client while 2 connections run long digests (2^28 ids each, again and again): the
# worker pool serves them in slices (job_slice_ids), so the Fetches are not held up behind them.
for rep in $(seq "$REPS"); do
  line=$("$SERVE" fetch --socket "$TMP/permd.sock" --dataset bench --clients 1 --count 1024 --seconds "$RUN_S" \
    --digest-load 2)
  V[loaded_1]+="$(kv "$line" rps) $(kv "$line" p50_us) $(kv "$line" p99_us);"
done
best() { tr ';' '\n' <<<"$1" | sed '/^$/d' | sort -g -k1,1 | tail -1; } # "rps p50 p99" of the fastest round
declare -A R
for k in redis permd small random odd; do
  for c in 1 32; do read -r R[${k}_rps_$c] R[${k}_p50_$c] R[${k}_p99_$c] <<<"$(best "${V[${k}_$c]}")"; done
done
read -r R[redismt_rps_32] R[redismt_p50_32] R[redismt_p99_32] <<<"$(best "${V[redismt_32]}")"
# The Redis the ratios and goals use: at 32 clients the faster of the two configurations.
RB1=${R[redis_rps_1]}
RB32=$(awk -v a="${R[redis_rps_32]}" -v b="${R[redismt_rps_32]}" 'BEGIN{print (a > b) ? a : b}')
read -r R[loaded_rps_1] R[loaded_p50_1] R[loaded_p99_1] <<<"$(best "${V[loaded_1]}")"
# Streams: ring and socket at 256 KiB and 4 MiB batches, and the bare socket.
declare -A SV
P=""
for rep in $(seq "$REPS"); do
  for b in 65536 1048576; do
    for t in ring socket; do
      if ! line=$("$SERVE" stream --socket "$TMP/permd.sock" --dataset bench --batch "$b" --seconds "$RUN_S" \
        --transport "$t" 2>"$TMP/stream.err"); then
        # A failed run must not pass for a slow one: say why, with permd's last words.
        { cat "$TMP/stream.err"; echo "serve.sh: the $t stream failed; permd's log ends:"; tail -5 "$TMP/permd.log"; } >&2
        exit 1
      fi
      SV[${t}_$b]+="$(kv "$line" ids_per_s);"
    done
  done
  P+="$(kv "$("$SERVE" pipe --batch 65536 --seconds "$RUN_S")" ids_per_s);"
done
STREAM=$(best "${SV[ring_65536]}")
STREAM_SOCK=$(best "${SV[socket_65536]}")
STREAM_BIG=$(best "${SV[ring_1048576]}")
STREAM_SOCK_BIG=$(best "${SV[socket_1048576]}")
PIPE=$(best "$P")
G=""
for rep in $(seq "$REPS"); do G+="$(kv "$("$SERVE" gen --count 1024 --seconds 2)" ids_per_s);"; done
GEN=$(best "$G")
ISA=$("$SERVE" gen --count 1024 --seconds 0.2 | tr ' ' '\n' | sed -n 's/^isa=//p')
# Parallel headroom: the generator alone on every CPU at once, versus one.
PAR=0
GENS=()
for i in $(seq "$NCPU"); do "$SERVE" gen --count 1024 --seconds 2 >"$TMP/gen.$i" & GENS+=($!); done
wait "${GENS[@]}"
for f in "$TMP"/gen.*; do PAR=$(awk -v a="$PAR" -v b="$(kv "$(cat "$f")" ids_per_s)" 'BEGIN{print a + b}'); done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }
met() { awk -v r="$1" 'BEGIN{print (r >= 1.0) ? "met" : "not met"}'; }
R1=$(ratio "${R[permd_rps_1]}" "$RB1")
R32=$(ratio "${R[permd_rps_32]}" "$RB32")
RS=$(ratio "$STREAM" 1000000000)
RSB=$(ratio "$STREAM_BIG" 1000000000)
MODEL=$(lscpu | awk -F: '/^Model name/{gsub(/^ +/, "", $2); print $2; exit}')
GEN_US=$(awk -v g="$GEN" 'BEGIN{printf "%.0f", 1024 / g * 1e6}')
STREAM_X=$(ratio "$STREAM" "$GEN")
REDIS_US=$(awk -v r="${R[redis_rps_1]}" 'BEGIN{printf "%.0f", 1e6 / r}')
VS=$(awk -v g="$GEN_US" -v r="$REDIS_US" 'BEGIN{print (g > r) ? "more than" : "less than"}')
mkdir -p "$(dirname "$OUT")"
KEPT=$(bench_kept "$OUT") # hand-written sections survive a rerun
{
  echo "# Serve benchmark: permd vs Redis"
  echo
  echo "- Date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- Machine: $MODEL, $NCPU CPUs ($(uname -sr)); the generator on all $NCPU CPUs at once runs"
  echo "  $(ratio "$PAR" "$GEN")× its one-CPU rate, so this machine has that much parallel compute."
  echo "- Before the run: load average (1/5/15 min) $LOAD; busiest process: $BUSY."
  echo "  Other work on these CPUs during the run lowers both peers' numbers."
  echo "- Command: \`bench/serve.sh\` (SECONDS_PER_RUN=$RUN_S, REPS=$REPS: each row is the fastest of $REPS interleaved runs), tree $TREE, permd $("$PERMD" --version | awk '{print $2}') with its"
  echo "  default config but \`gpu: off\` (workers = CPUs, loops $("$PERMD" --print-template | sed -n "s/^loops: *//p") = min(CPUs, 4), inline_ids $("$PERMD" --print-template | sed -n "s/^inline_ids: *//p")), $(redis-server --version | awk '{print $1, $2, $3}')"
  echo "- Peers on private Unix sockets; Redis: \`redis-benchmark -t get -c C\` of one 4096-byte value, and at 32"
  echo "  clients also Redis with \`--io-threads $LOOPS --io-threads-do-reads yes\` under \`redis-benchmark --threads $RT\`;"
  echo "  \"permd / Redis\" divides by the faster Redis of the row's client count."
  echo "  permd: \`bench/serve fetch --clients C --count 1024\` (1024 u32 ids = 4096 bytes, rank 0 of 8,"
  echo "  dataset of 2^32 samples), one connection per client thread. Each client reads its slice in order,"
  echo "  as a trainer does, so permd's readahead may have the next ids ready; the \"random offsets\" rows"
  echo "  ask for a random piece each time (\`--offsets random\`), which no readahead predicts, and the"
  echo "  \"n = 2^31 + 1\" rows read a dataset where σ cycle-walks about twice per id (2^32 never walks)."
  echo
  echo "| workload | clients | requests/s | p50 µs | p99 µs | permd / Redis |"
  echo "|---|---:|---:|---:|---:|---:|"
  for c in 1 32; do
    rb=$([ "$c" = 1 ] && echo "$RB1" || echo "$RB32")
    echo "| Redis GET 4 KiB | $c | ${R[redis_rps_$c]} | ${R[redis_p50_$c]} | ${R[redis_p99_$c]} | |"
    [ "$c" = 32 ] && echo "| Redis GET 4 KiB, $LOOPS I/O threads, benchmark on $RT threads | $c | ${R[redismt_rps_$c]} | ${R[redismt_p50_$c]} | ${R[redismt_p99_$c]} | |"
    echo "| permd Fetch 1024 u32 | $c | ${R[permd_rps_$c]} | ${R[permd_p50_$c]} | ${R[permd_p99_$c]} | $(ratio "${R[permd_rps_$c]}" "$rb") |"
    echo "| permd Fetch 1024 u32, random offsets | $c | ${R[random_rps_$c]} | ${R[random_p50_$c]} | ${R[random_p99_$c]} | $(ratio "${R[random_rps_$c]}" "$rb") |"
    echo "| permd Fetch 1024 u32, n = 2^31 + 1 | $c | ${R[odd_rps_$c]} | ${R[odd_p50_$c]} | ${R[odd_p99_$c]} | $(ratio "${R[odd_rps_$c]}" "$rb") |"
    echo "| permd Fetch 16 u32 (protocol cost) | $c | ${R[small_rps_$c]} | ${R[small_p50_$c]} | ${R[small_p99_$c]} | $(ratio "${R[small_rps_$c]}" "$rb") |"
  done
  echo "| permd Fetch 1024 u32 while 2 connections digest 2^28 ids, again and again | 1 | ${R[loaded_rps_1]} | ${R[loaded_p50_1]} | ${R[loaded_p99_1]} | $(ratio "${R[loaded_rps_1]}" "$RB1") |"
  echo
  echo "Under long jobs (the row above): Fetch p99 $(ratio "${R[loaded_p99_1]}" "${R[permd_p99_1]}")× its unloaded p99 at 1 client (digests run in"
  echo "slices of job_slice_ids on the worker pool; a Fetch within the loop's inline budget never waits for it)."
  echo
  echo "| stream | ids/s | goal | ratio |"
  echo "|---|---:|---:|---:|"
  echo "| one Stream, batches of 65536 u32 (256 KiB), shared-memory ring (libpermd's default) | $(printf '%.0f' "$STREAM") | 1000000000 | $RS |"
  echo "| one Stream, batches of 65536 u32 (256 KiB), through the socket | $(printf '%.0f' "$STREAM_SOCK") | 1000000000 | $(ratio "$STREAM_SOCK" 1000000000) |"
  echo "| one Stream, batches of 1048576 u32 (4 MiB), shared-memory ring | $(printf '%.0f' "$STREAM_BIG") | 1000000000 | $RSB |"
  echo "| one Stream, batches of 1048576 u32 (4 MiB), through the socket | $(printf '%.0f' "$STREAM_SOCK_BIG") | 1000000000 | $(ratio "$STREAM_SOCK_BIG" 1000000000) |"
  echo "| (peer) a bare Unix socket, 256 KiB writes, reader sums every u32, no daemon | $(printf '%.0f' "$PIPE") | | |"
  echo "| (context) the CPU generator ($ISA), one thread, no daemon | $(printf '%.0f' "$GEN") | | |"
  echo
  echo "Goals: permd ≥ 1.0× Redis at 1 client: **$(met "$R1")** ($R1×); at 32 clients: **$(met "$R32")** ($R32×);"
  echo "stream ≥ 1 G ids/s (shared-memory ring): at 256 KiB batches **$(met "$RS")** ($(printf '%.3f' "$RS")×);"
  echo "at 4 MiB batches **$(met "$RSB")** ($(printf '%.3f' "$RSB")×)."
  echo
  echo "Where the time goes: the 16-id rows isolate permd's serving path (framing, protobuf-c, libuv,"
  echo "one write per reply); there permd runs at $(ratio "${R[small_rps_1]}" "$RB1")× and $(ratio "${R[small_rps_32]}" "$RB32")× Redis's rate. A 1024-id Fetch adds"
  echo "generation: the CPU generator ($ISA) alone needs ${GEN_US} µs for 1024 ids on one CPU"
  echo "($(printf '%.0f' "$GEN") ids/s), $VS a whole Redis GET at 1 client (${REDIS_US} µs), which is what"
  echo "separates the 1024-id rows from the 16-id rows. The stream delivers ${STREAM_X}× the"
  echo "one-thread generator rate (the worker pool runs batches in parallel; the reader shares the CPUs)."
  echo "Every stream row's reader sums every id it receives, as a consumer would."
  echo "Through the socket a stream pays two copies (into the kernel, out to the reader) and can"
  echo "go no faster than the bare socket row, $(ratio "$STREAM_SOCK" "$PIPE")× of which it reaches; the ring stream"
  echo "skips both (the pool writes ids into memory the reader maps) and runs $(ratio "$STREAM" "$STREAM_SOCK")× the socket stream."
  echo "Generation goes through daemon/backend.c: the SIMD pool (permd runs with \`gpu: off\`), so these rows"
  echo "measure the CPU backend and the serving path."
  bench_append_kept "$KEPT"
} >"$OUT.new"
mv "$OUT.new" "$OUT"
cat "$OUT"
