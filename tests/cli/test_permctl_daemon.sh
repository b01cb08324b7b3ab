#!/usr/bin/env bash
# CLI test: permctl's daemon subcommands against a real permd — outputs, --json, exit codes and messages.
set -euo pipefail

BIN=${1:?usage: test_permctl_daemon.sh BIN_DIR SOURCE_DIR}
SRC=${2:?}
source "$(dirname "$0")/permd_fixture.sh"
permd_fixture_start "$BIN" cli
# expect CODE NEEDLE CMD...: run CMD, want exit CODE and NEEDLE in its stderr.
expect() {
  local code=$1 needle=$2; shift 2
  local rc=0
  "$@" >"$DIR/out" 2>"$DIR/err" || rc=$?
  [ "$rc" = "$code" ] || fail "$* exited $rc, wanted $code: $(cat "$DIR/err")"
  grep -qF -- "$needle" "$DIR/err" || fail "$*: stderr lacks '$needle': $(cat "$DIR/err")"
}

# The quickstart session (docs/quickstart-daemon.md) works as printed.
"$PERMCTL" datasets put imagenet --size 1281167 | grep -qx "created imagenet (size 1281167)" || fail "put"
"$PERMCTL" datasets put imagenet --size 1281167 | grep -qx "exists imagenet (size 1281167)" || fail "put again"
"$PERMCTL" datasets list | grep -qE "^imagenet +1281167 +4 +api +- +- +-$" || fail "list"
"$PERMCTL" datasets get imagenet --json | grep -qF '"name":"imagenet","size":1281167,"id_width":4,"source":"api"' \
  || fail "get --json"
"$PERMCTL" datasets list --json | grep -q '^{"datasets":\[{"name":"imagenet"' || fail "list --json"

# fetch and stream print exactly what the offline rank prints.
for mode in pad drop exact; do
  args=(--seed 42 --epoch 3 --world 7 --rank 5 --mode "$mode")
  "$PERMCTL" rank --size 1281167 "${args[@]}" --offset 21 --count 1000 >"$DIR/want"
  "$PERMCTL" fetch imagenet "${args[@]}" --offset 21 --count 1000 >"$DIR/got"
  cmp -s "$DIR/want" "$DIR/got" || fail "fetch $mode differs from rank"
  "$PERMCTL" stream imagenet "${args[@]}" --offset 21 --count 1000 --batch 77 >"$DIR/got"
  cmp -s "$DIR/want" "$DIR/got" || fail "stream $mode differs from rank"
done
# A whole rank, streamed, and a fetch larger than max_count (fetched in pieces).
"$PERMCTL" rank --size 1281167 --seed 1 --epoch 0 --world 3 --rank 2 --mode drop >"$DIR/want"
"$PERMCTL" stream imagenet --seed 1 --epoch 0 --world 3 --rank 2 --mode drop >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "whole stream differs from rank"
[ "$(wc -l <"$DIR/got")" = 427055 ] || fail "whole stream length"
# A reader that goes away while SIGPIPE is ignored: permctl stops at the failed write, exit 1 (it went on
# streaming a 2^62-sample rank to nobody).
"$PERMCTL" datasets put huge --size 4611686018427387904 >/dev/null
for cmd in "stream" "fetch --count 100000000"; do
  rc=$(bash -c 'trap "" PIPE; timeout 60 "$1" $2 huge --seed 1 --epoch 0 --world 1 --rank 0 --mode pad 2>"$3" |
                head -c1 >/dev/null; echo "${PIPESTATUS[0]}"' _ "$PERMCTL" "$cmd" "$DIR/err")
  [ "$rc" = 1 ] && grep -qF "writing output failed" "$DIR/err" || fail "$cmd into a closed pipe: exit $rc, $(cat "$DIR/err")"
done
"$PERMCTL" datasets rm huge >/dev/null
"$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 3 --rank 2 --mode drop --count 2000000 >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "large fetch differs from rank"

"$PERMCTL" fetch imagenet --seed 42 --epoch 3 --world 7 --rank 5 --mode pad --count 3 --json >"$DIR/got"
want=$("$PERMCTL" rank --size 1281167 --seed 42 --epoch 3 --world 7 --rank 5 --mode pad --count 3 | paste -sd,)
grep -qx "{\"ids\":\[$want\],\"next_offset\":21}" "$DIR/got" || fail "fetch --json: $(cat "$DIR/got")"

# inverse NAME: positions agree with the offline inverse; ranks are position mod W.
"$PERMCTL" inverse --size 1281167 --seed 42 --epoch 3 17 99 >"$DIR/want"
"$PERMCTL" inverse imagenet --seed 42 --epoch 3 --world 7 17 99 >"$DIR/got"
paste -d' ' "$DIR/want" <(awk '{print $1 % 7}' "$DIR/want") | cmp -s - "$DIR/got" || fail "inverse NAME"
"$PERMCTL" inverse imagenet --seed 42 --epoch 3 --world 7 --json 17 | grep -q '^{"samples":\[17\],"positions":\[' \
  || fail "inverse --json"

"$PERMCTL" stats | grep -qE "^ids_served_total +[1-9]" || fail "stats"
"$PERMCTL" stats --json | grep -q '"requests_total":' || fail "stats --json"

# Wrong command lines: exit 2 and say what is wrong, before touching the daemon.
expect 2 "--count is required" "$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 2 --rank 0 --mode pad
expect 2 "give a dataset NAME" "$PERMCTL" fetch --seed 1 --epoch 0 --world 2 --rank 0 --mode pad --count 1
expect 2 "must be below --world" "$PERMCTL" stream imagenet --seed 1 --epoch 0 --world 2 --rank 2 --mode pad
expect 2 "not one of pad, drop, exact" "$PERMCTL" stream imagenet --seed 1 --epoch 0 --world 2 --rank 0 --mode all
expect 2 "unknown action" "$PERMCTL" datasets show imagenet
# Names and addresses are checked here, as usage errors (exit 2), before anything is sent.
expect 2 "'' is not a name" "$PERMCTL" datasets put "" --size 5
expect 2 "is not a name" "$PERMCTL" datasets get "$(printf 'n%.0s' $(seq 129))"
expect 2 "'a b' is not a name" "$PERMCTL" fetch "a b" --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --count 1
expect 2 "is not a name" "$PERMCTL" mixtures get "-x"
expect 2 "--components: 'b c' is not a name" "$PERMCTL" mixtures put m --components "a,b c" --weights 1,1
expect 2 "--socket: socket path too long" "$PERMCTL" stats --socket "/tmp/$(printf 'x%.0s' $(seq 120))"
PERMD_SOCKET="/tmp/$(printf 'x%.0s' $(seq 120))" expect 2 "\$PERMD_SOCKET: the default socket path is too long" "$PERMCTL" stats
expect 2 "--tcp: '127.0.0.1:99999' is not HOST:PORT" "$PERMCTL" stats --tcp 127.0.0.1:99999
# without a port, the default one is tried: the error names it (where nothing listens there)
if ! (exec 3<>/dev/tcp/127.0.0.1/7470) 2>/dev/null; then
  expect 1 "cannot connect to 127.0.0.1 (port 7470, permd's default)" "$PERMCTL" stats --tcp 127.0.0.1
fi
expect 2 "is above 2^64 - 1" "$PERMCTL" inverse imagenet --seed 42 --epoch 3 --world 8 18446744073709551616
expect 2 "give --size N or --shards-file FILE" "$PERMCTL" datasets put other
expect 2 "not both" "$PERMCTL" stats --socket "$PERMD_SOCKET" --tcp 127.0.0.1:1
expect 2 "unknown option '--bogus'" "$PERMCTL" stats --bogus
expect 2 "not an unsigned decimal" "$PERMCTL" inverse imagenet --seed 1 --epoch 0 --world 2 x
expect 2 "give an action" "$PERMCTL" datasets

# Connection options may come before COMMAND (permctl --socket PATH datasets list), each form, with the
# command's own options, a "--" and its positionals; one given before and after is given twice.
(sock=$PERMD_SOCKET; unset PERMD_SOCKET
 "$PERMCTL" --socket "$sock" datasets list | grep -q "^imagenet " || fail "--socket before datasets list"
 "$PERMCTL" --socket="$sock" --timeout-ms 5000 fetch imagenet --seed 42 --epoch 3 --world 7 --rank 5 \
   --mode pad --count 3 >"$DIR/got" || fail "--socket= --timeout-ms before fetch"
 "$PERMCTL" rank --size 1281167 --seed 42 --epoch 3 --world 7 --rank 5 --mode pad --count 3 | cmp -s - "$DIR/got" \
   || fail "fetch with leading options differs from rank"
 "$PERMCTL" --socket "$sock" inverse imagenet --seed 42 --epoch 3 --world 7 -- 17 >"$DIR/got" \
   && [ "$(wc -l <"$DIR/got")" = 1 ] || fail "--socket before inverse with --"
 expect 1 "is permd running?" "$PERMCTL" --socket "$DIR/absent.sock" stats
 expect 2 "not both" "$PERMCTL" --tcp 127.0.0.1:1 stats --socket "$sock"
 expect 2 "--socket given twice" "$PERMCTL" --socket "$DIR/absent.sock" stats --socket "$sock"
 expect 2 "rank: unknown option '--socket'" "$PERMCTL" --socket "$sock" rank --size 5
 expect 2 "missing COMMAND" "$PERMCTL" --socket "$sock")

# The daemon's errors: exit 1 with the typed error and its message.
expect 1 "NOT_FOUND: dataset 'nope' does not exist" "$PERMCTL" fetch nope --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --count 1
expect 1 "CONFLICT: dataset 'imagenet' exists with size 1281167, not 5" "$PERMCTL" datasets put imagenet --size 5
expect 2 "'bad/name' is not a name" "$PERMCTL" datasets put 'bad/name' --size 5 # caught here, before permd
expect 1 "past the end of the epoch" "$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --offset 2000000 --count 1
expect 1 "is not below the dataset size" "$PERMCTL" inverse imagenet --seed 1 --epoch 0 --world 2 1281167
expect 1 "is permd running?" "$PERMCTL" stats --socket "$DIR/absent.sock"
expect 1 "$DIR: it is not a socket" "$PERMCTL" stats --socket "$DIR" # a directory given by mistake

# --count 0 still asks permd, which checks the name and the offset (it printed an empty answer and exited 0).
expect 1 "NOT_FOUND" "$PERMCTL" fetch nope --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --count 0 --json
expect 1 "past the end of the epoch" "$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --offset 2000000 --count 0
expect 1 "NOT_FOUND" "$PERMCTL" stream nope --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --count 0
[ "$("$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --count 0 --json)" = '{"ids":[],"next_offset":0}' ] \
  || fail "fetch --count 0"
# verify: a line too long for an id is refused (it was read as two ids); exit 2, nothing compared.
"$PERMCTL" perm --seed 1 --epoch 0 --size 3 | sed 's/^0$/0000000000000000000000000000000000000000000000000000000000000000000000/' >"$DIR/long"
expect 2 "a line longer than" "$PERMCTL" verify --size 3 --seed 1 --epoch 0 --world 1 --rank 0 --mode exact "$DIR/long"
# a verdict that cannot be written is a failure (exit 1), not a silent ok
"$PERMCTL" perm --seed 1 --epoch 0 --size 3 >"$DIR/three"
rc=0; "$PERMCTL" verify --size 3 --seed 1 --epoch 0 --world 1 --rank 0 --mode exact "$DIR/three" >/dev/full 2>"$DIR/err" \
  || rc=$?
[ "$rc" = 1 ] && grep -q "writing output" "$DIR/err" || fail "verify into /dev/full: exit $rc"

# A fetch --json that fails leaves stdout empty (no JSON prefix for a parser to choke on); stderr says why.
expect 1 "past the end of the epoch" "$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --offset 2000000 --count 3 --json
[ ! -s "$DIR/out" ] || fail "failed fetch --json printed: $(cat "$DIR/out")"
expect 1 "NOT_FOUND" "$PERMCTL" fetch nope --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --count 3 --json
[ ! -s "$DIR/out" ] || fail "failed fetch --json printed: $(cat "$DIR/out")"
# One fetched in pieces (above max_count) is one JSON document with every id.
"$PERMCTL" fetch imagenet --seed 1 --epoch 0 --world 3 --rank 2 --mode drop --count 2000000 --json >"$DIR/got"
{ printf '{"ids":['
  "$PERMCTL" rank --size 1281167 --seed 1 --epoch 0 --world 3 --rank 2 --mode drop | paste -sd, | tr -d '\n'
  printf '],"next_offset":1281165}\n'; } >"$DIR/want"
cmp -s "$DIR/want" "$DIR/got" || fail "fetch --json in pieces"

# Locations take 16 bytes: a reply of 900000 (within max_count) fits the client's frame bound.
printf '300000\n300000\n300000\n' >"$DIR/shards.txt"
"$PERMCTL" datasets put sh --shards-file "$DIR/shards.txt" >/dev/null || fail "put sh"
"$PERMCTL" fetch sh --seed 1 --epoch 0 --world 1 --rank 0 --mode exact --count 900000 --locations >"$DIR/got" \
  || fail "fetch --locations of 900000"
"$PERMCTL" stream sh --seed 1 --epoch 0 --world 1 --rank 0 --mode exact --batch 1000 --locations >"$DIR/want"
cmp -s "$DIR/want" "$DIR/got" || fail "fetch --locations differs from stream"
[ "$(wc -l <"$DIR/got")" = 900000 ] || fail "fetch --locations length"

# Against a permd whose max_count is below stream's default batch, stream fits its batches to it.
"$PERMD" --socket "$DIR/small.sock" --state-dir "$DIR/small" --metrics "" --max-count 1000 2>"$DIR/small.log" &
SMALL=$!
trap 'kill "$SMALL" 2>/dev/null || true; permd_fixture_cleanup' EXIT # a failure below must not leave it running
for _ in $(seq 200); do [ -S "$DIR/small.sock" ] && break; sleep 0.05; done
"$PERMCTL" datasets put a --size 5000 --socket "$DIR/small.sock" >/dev/null || fail "put on the small permd"
"$PERMCTL" rank --size 5000 --seed 1 --epoch 0 --world 1 --rank 0 --mode pad >"$DIR/want"
"$PERMCTL" stream a --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --socket "$DIR/small.sock" >"$DIR/got" \
  || fail "stream with max_count 1000"
cmp -s "$DIR/want" "$DIR/got" || fail "stream with max_count 1000 differs from rank"
# a --batch above it is the command line's fault, said in its terms
rc=0; "$PERMCTL" stream a --seed 1 --epoch 0 --world 1 --rank 0 --mode pad --socket "$DIR/small.sock" --batch 1001 \
  >/dev/null 2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] && grep -q "^permctl: --batch: 1001 is above this permd's max_count, 1000" "$DIR/err" \
  || fail "stream --batch above max_count: rc=$rc $(cat "$DIR/err")"
# and inverse asks for more samples than max_count in pieces.
samples=$(seq 0 2 2999)
"$PERMCTL" inverse --size 5000 --seed 1 --epoch 0 $samples | sed 's/$/ 0/' >"$DIR/want"
"$PERMCTL" inverse a --seed 1 --epoch 0 --world 1 --socket "$DIR/small.sock" $samples >"$DIR/got" \
  || fail "inverse of 1500 samples with max_count 1000"
cmp -s "$DIR/want" "$DIR/got" || fail "inverse in pieces differs from the offline inverse"
kill -TERM "$SMALL"
wait "$SMALL" || fail "the small permd exited $?"
trap permd_fixture_cleanup EXIT

# Token files are read by permd's rules (daemon/auth.c): a regular file whose first line, without its line end,
# is 1-1024 bytes with no NUL. Anything else is refused naming the file, before connecting; a FIFO used to
# block permctl for ever in fopen() (timeout turns such a hang into a failure).
mkfifo "$DIR/fifo"
mkdir "$DIR/tokdir"
printf 'abc\0def\n' >"$DIR/tok-nul"
printf 'abcdef\tghijklmnopq\n' >"$DIR/tok-tab"
head -c 1025 /dev/zero | tr '\0' a >"$DIR/tok-long"
printf '\nsecond line\n' >"$DIR/tok-empty"
expect 2 "--token-file: $DIR/fifo is not a regular file" timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/fifo"
expect 2 "$DIR/tokdir is not a regular file" timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/tokdir"
expect 2 "/dev/zero is not a regular file" timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file /dev/zero
expect 2 "the first line of $DIR/tok-nul holds the control byte 0x00 at byte 3" \
  timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/tok-nul"
expect 2 "the first line of $DIR/tok-tab holds the control byte 0x09 at byte 6" \
  timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/tok-tab"
expect 2 "the first line of $DIR/tok-long is longer than 1024 bytes" \
  timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/tok-long"
expect 2 "the first line of $DIR/tok-empty is empty" \
  timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/tok-empty"
expect 2 "cannot open $DIR/absent: No such file" timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1 --token-file "$DIR/absent"
PERMD_TOKEN_FILE="$DIR/fifo" expect 2 "\$PERMD_TOKEN_FILE: $DIR/fifo is not a regular file" \
  timeout 20 "$PERMCTL" stats --tcp 127.0.0.1:1
# A good one authenticates: the first line without its \r\n, the rest ignored (as permd reads its own).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
TCP=127.0.0.1:$(free_port)
printf 'cli-test-token-0123456789\n' >"$DIR/token"
printf 'cli-test-token-0123456789\r\nanything after the first line\0\n' >"$DIR/token-crlf"
printf 'cli-test-token-0123456789-not\n' >"$DIR/token-wrong"
chmod 600 "$DIR/token" "$DIR/token-crlf" "$DIR/token-wrong"
"$PERMD" --socket "$DIR/tcp.sock" --state-dir "$DIR/tcp" --metrics "" --tcp "$TCP" --token-file "$DIR/token" \
  2>"$DIR/tcp.log" &
TCPD=$!
trap 'kill "$TCPD" 2>/dev/null || true; permd_fixture_cleanup' EXIT
for _ in $(seq 200); do "$PERMCTL" stats --tcp "$TCP" --token-file "$DIR/token" >/dev/null 2>&1 && break; sleep 0.05; done
"$PERMCTL" stats --tcp "$TCP" --token-file "$DIR/token" 2>"$DIR/err" | grep -q "^server " \
  || fail "stats over TCP with a token file"
[ ! -s "$DIR/err" ] || fail "a token file of mode 600 drew a warning: $(cat "$DIR/err")"
cp "$DIR/token" "$DIR/token-open" && chmod 644 "$DIR/token-open" # used, with a warning
"$PERMCTL" stats --tcp "$TCP" --token-file "$DIR/token-open" 2>"$DIR/err" | grep -q "^server " \
  || fail "stats with a token file of mode 644"
grep -qF -- "--token-file: $DIR/token-open is open to group or others (mode 0644); chmod 600 it" "$DIR/err" \
  || fail "no warning for a token file of mode 644: $(cat "$DIR/err")"
"$PERMCTL" stats --tcp "$TCP" --token-file "$DIR/token-crlf" | grep -q "^server " || fail "a token file with CRLF"
PERMD_TOKEN_FILE="$DIR/token" "$PERMCTL" stats --tcp "$TCP" | grep -q "^server " || fail "\$PERMD_TOKEN_FILE"
expect 1 "UNAUTHENTICATED" "$PERMCTL" stats --tcp "$TCP" --token-file "$DIR/token-wrong"
kill -TERM "$TCPD"
wait "$TCPD" || fail "the TCP permd exited $?"
trap permd_fixture_cleanup EXIT

# permctl health: GET /healthz on the metrics endpoint (the container HEALTHCHECK). A permd with all of its
# max_connections taken is busy, not broken: stats is OVERLOADED there, health is not.
MPORT=$(free_port)
"$PERMD" --socket "$DIR/h.sock" --state-dir "$DIR/h" --metrics "127.0.0.1:$MPORT" --max-connections 1 \
  2>"$DIR/h.log" &
HPID=$!
trap 'kill "$HPID" ${HOLD:+"$HOLD"} 2>/dev/null || true; permd_fixture_cleanup' EXIT
for _ in $(seq 200); do "$PERMCTL" health --http "127.0.0.1:$MPORT" >/dev/null 2>&1 && break; sleep 0.05; done
[ "$(timeout 20 "$PERMCTL" health --http "127.0.0.1:$MPORT")" = ok ] || fail "health of an idle permd"
rc=0; timeout 20 "$PERMCTL" health --http "127.0.0.1:$MPORT" >/dev/full 2>/dev/null || rc=$?
[ "$rc" = 1 ] || fail "health into /dev/full: exit $rc"
# another server's 200 with an empty body (a proxy's) reads "ok", not an empty line
EPORT=$(free_port)
python3 -c 'import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1); print("up", flush=True); c, _ = s.accept(); c.recv(4096)
c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); c.close()' "$EPORT" >"$DIR/eup" &
EMPTY=$!
for _ in $(seq 200); do grep -q up "$DIR/eup" && break; sleep 0.05; done
[ "$(timeout 20 "$PERMCTL" health --http "127.0.0.1:$EPORT")" = ok ] || fail "health of an empty 200"
wait "$EMPTY" 2>/dev/null || true
python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("held", flush=True); time.sleep(600)' \
  "$DIR/h.sock" >"$DIR/held" &
HOLD=$!
for _ in $(seq 200); do grep -q held "$DIR/held" && break; sleep 0.05; done
expect 1 "OVERLOADED" "$PERMCTL" stats --socket "$DIR/h.sock"
[ "$(timeout 20 "$PERMCTL" health --http "127.0.0.1:$MPORT")" = ok ] || fail "health of a busy permd"
kill "$HOLD"
wait "$HOLD" 2>/dev/null || true
kill -TERM "$HPID"
wait "$HPID" || fail "the health permd exited $?"
trap permd_fixture_cleanup EXIT
expect 1 "GET http://127.0.0.1:$MPORT/healthz: Connection refused" timeout 20 "$PERMCTL" health --http "127.0.0.1:$MPORT"
# A server that answers 503 (permd stopping), and one that never answers (--timeout-ms bounds the wait).
python3 -c 'import socket, time
l = socket.create_server(("127.0.0.1", 0)); print(l.getsockname()[1], flush=True)
c, _ = l.accept(); c.recv(4096)
c.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\nConnection: close\r\n\r\nstopping\n")
c.close(); l2 = socket.create_server(("127.0.0.1", 0)); print(l2.getsockname()[1], flush=True); time.sleep(600)' \
  >"$DIR/fake" &
FAKE=$!
trap 'kill "$FAKE" 2>/dev/null || true; permd_fixture_cleanup' EXIT
for _ in $(seq 200); do [ -s "$DIR/fake" ] && break; sleep 0.05; done
expect 1 "answered 'HTTP/1.1 503 Service Unavailable': stopping" timeout 20 "$PERMCTL" health --http "127.0.0.1:$(head -1 "$DIR/fake")"
for _ in $(seq 200); do [ "$(wc -l <"$DIR/fake")" = 2 ] && break; sleep 0.05; done
expect 1 "no answer in time (--timeout-ms)" \
  timeout 20 "$PERMCTL" health --http "127.0.0.1:$(tail -1 "$DIR/fake")" --timeout-ms 200
kill "$FAKE"
wait "$FAKE" 2>/dev/null || true
trap permd_fixture_cleanup EXIT
expect 2 "--http is required" "$PERMCTL" health

# --timeout-ms on daemon commands: a socket that accepts and never answers fails in about that time (the
# Hello alone would wait 10 s); a real permd answers within it (the control); 0 is not a timeout.
python3 -c 'import socket, sys, time
l = socket.socket(socket.AF_UNIX); l.bind(sys.argv[1]); l.listen(4); print("up", flush=True); time.sleep(600)' \
  "$DIR/mute.sock" >"$DIR/mute" &
MUTE=$!
trap 'kill "$MUTE" 2>/dev/null || true; permd_fixture_cleanup' EXIT
for _ in $(seq 200); do [ -s "$DIR/mute" ] && break; sleep 0.05; done
start=$(date +%s)
expect 1 "no answer from permd within 300 ms" timeout 20 "$PERMCTL" stats --socket "$DIR/mute.sock" --timeout-ms 300
[ $(($(date +%s) - start)) -lt 5 ] || fail "stats --timeout-ms 300 took $(($(date +%s) - start)) s"
kill "$MUTE"
wait "$MUTE" 2>/dev/null || true
trap permd_fixture_cleanup EXIT
"$PERMCTL" stats --timeout-ms 5000 | grep -qE "^ids_served_total +[1-9]" || fail "stats --timeout-ms on a live permd"
"$PERMCTL" fetch imagenet --seed 42 --epoch 3 --world 8 --rank 5 --mode pad --count 3 --timeout-ms 5000 \
  | tr '\n' ' ' | grep -qx "1211840 1011015 420903 " || fail "fetch --timeout-ms on a live permd"
expect 2 "--timeout-ms" "$PERMCTL" stats --timeout-ms 0
expect 2 "'127.0.0.1' is not HOST:PORT" "$PERMCTL" health --http 127.0.0.1

"$PERMCTL" datasets rm imagenet | grep -qx "deleted imagenet" || fail "rm"
expect 1 "NOT_FOUND" "$PERMCTL" datasets rm imagenet

# The documented config is exactly what the table generates, and it loads.
"$PERMD" --print-template | cmp -s - "$SRC/config/permd.yaml" || fail "config/permd.yaml is out of date: regenerate with permd --print-template"
"$PERMD" --check-config --config "$SRC/config/permd.yaml" >/dev/null 2>"$DIR/err" || fail "template does not validate"
expect 2 "max_frame" "$PERMD" --check-config --max-frame 1
# ... and says what its defaults come to here (socket "" and workers 0 print as such above)
env -u PERMD_SOCKET XDG_RUNTIME_DIR="$DIR/xdg" "$PERMD" --check-config --workers 3 --state-dir "$DIR/sd" 2>/dev/null |
  grep -qxF "# resolved here: socket $DIR/xdg/permd.sock, state_dir $DIR/sd, workers 3" ||
  fail "--check-config does not say what the defaults resolve to"
# a state_dir too long for a path is said so (it read "no state directory ... HOME is not set either")
expect 2 "state_dir: the path is longer than 4095 bytes" "$PERMD" --check-config --state-dir "/$(head -c 5000 /dev/zero | tr '\0' a)"

kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
PID=
[ "$rc" = 0 ] || fail "permd exited $rc on SIGTERM"
[ ! -e "$PERMD_SOCKET" ] || fail "socket left behind"
echo "ok"
