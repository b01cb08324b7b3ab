#!/usr/bin/env bash
# CLI test: sharded datasets through permctl and a real permd — put from a file, fetch/stream equal to the
# offline rank, locations, verify (ok and mismatch), and bad input.
set -euo pipefail

BIN=${1:?usage: test_permctl_shards.sh BIN_DIR}
PERMCTL="$BIN/permctl"
DIR=$(mktemp -d /tmp/permd-shards-cli-XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

export PERMD_SOCKET="$DIR/permd.sock"
"$BIN/permd" --state-dir "$DIR/state" 2>"$DIR/permd.log" &
PID=$!
for _ in $(seq 200); do [ -S "$PERMD_SOCKET" ] && break; sleep 0.05; done
[ -S "$PERMD_SOCKET" ] || fail "permd did not start: $(cat "$DIR/permd.log")"

# 300 shards: empty, single-sample and larger ones
for i in $(seq 0 299); do echo $(( i % 7 == 0 ? 0 : (i * 37) % 50 )); done >"$DIR/shards.txt"
"$PERMCTL" datasets put web --shards-file "$DIR/shards.txt" --window 4 --lanes 2 \
  | grep -q "^created web (size [0-9]*, 300 shards, window 4, lanes 2)$" || fail "put sharded"
"$PERMCTL" datasets get web --json | grep -qF '"shards":300,"window":4,"lanes":2' || fail "get --json"

slice=(--seed 7 --epoch 2 --world 3 --rank 1 --mode pad)
offline=("$PERMCTL" rank --shards-file "$DIR/shards.txt" --window 4 --lanes 2 "${slice[@]}")
"${offline[@]}" >"$DIR/want"
"$PERMCTL" fetch web "${slice[@]}" --count 100000 >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "fetch differs from the offline rank"
"$PERMCTL" stream web "${slice[@]}" --batch 37 >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "stream differs from the offline rank"
"${offline[@]}" --locations >"$DIR/want_loc"
"$PERMCTL" stream web "${slice[@]}" --locations --batch 50 >"$DIR/got_loc"
cmp -s "$DIR/want_loc" "$DIR/got_loc" || fail "stream --locations differs"
"$PERMCTL" fetch web "${slice[@]}" --count 3 --locations --json | grep -q '^{"locations":\[\[[0-9]*,[0-9]*\],' \
  || fail "fetch --locations --json"
# overrides: another window and lanes give the offline answer for them
"$PERMCTL" fetch web "${slice[@]}" --window 9 --lanes 3 --count 100000 >"$DIR/got"
"$PERMCTL" rank --shards-file "$DIR/shards.txt" --window 9 --lanes 3 "${slice[@]}" | cmp -s - "$DIR/got" \
  || fail "window/lanes override"

# verify: exactly once for the exact mode, mismatch for a repeated id
vslice=(--seed 7 --epoch 2 --world 3 --rank 1 --mode exact --offset 30)
"$PERMCTL" fetch web "${vslice[@]}" --count 100000 >"$DIR/ids"
"$PERMCTL" verify web "${vslice[@]}" "$DIR/ids" | grep -q "^ok: " || fail "verify ok"
(cat "$DIR/ids"; head -1 "$DIR/ids") >"$DIR/dup"
rc=0; "$PERMCTL" verify web "${vslice[@]}" "$DIR/dup" >"$DIR/out" || rc=$?
[ "$rc" = 1 ] && grep -q "^MISMATCH" "$DIR/out" || fail "verify should report the repeated id (rc=$rc)"
sort -n "$DIR/ids" | "$PERMCTL" verify web "${vslice[@]}" | grep -q "^ok: " || fail "verify is order independent"

# bad input: typed errors, the daemon keeps serving
printf '3\nx\n' >"$DIR/bad.txt"
rc=0; "$PERMCTL" datasets put bad --shards-file "$DIR/bad.txt" 2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] && grep -q "bad.txt:2" "$DIR/err" || fail "bad shards file: rc=$rc $(cat "$DIR/err")"
rc=0; "$PERMCTL" datasets put web --shards-file "$DIR/shards.txt" --window 5 2>"$DIR/err" || rc=$?
[ "$rc" = 1 ] && grep -q "another size, shard layout" "$DIR/err" || fail "conflict: rc=$rc $(cat "$DIR/err")"
"$PERMCTL" datasets put flat --size 10 >/dev/null
rc=0; "$PERMCTL" fetch flat --seed 1 --epoch 1 --world 1 --rank 0 --mode pad --count 3 --locations 2>"$DIR/err" || rc=$?
[ "$rc" = 1 ] && grep -q "apply to sharded datasets" "$DIR/err" || fail "locations on flat: rc=$rc $(cat "$DIR/err")"
"$PERMCTL" fetch web "${slice[@]}" --count 1 >/dev/null || fail "daemon stopped serving"
echo ok
