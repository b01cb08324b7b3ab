#!/usr/bin/env bash
# CLI test: sharded datasets through permctl and a real permd — put from a file, from WebDataset tars and from
# an MDS index, fetch/stream equal to the offline rank, locations, verify (ok and mismatch), and bad input.
set -euo pipefail

BIN=${1:?usage: test_permctl_shards.sh BIN_DIR}
source "$(dirname "$0")/permd_fixture.sh"
permd_fixture_start "$BIN" shards-cli

# 300 shards: empty, single-sample and larger ones
for i in $(seq 0 299); do echo $(( i % 7 == 0 ? 0 : (i * 37) % 50 )); done >"$DIR/shards.txt"
"$PERMCTL" datasets put web --shards-file "$DIR/shards.txt" --window 4 --lanes 2 \
  | grep -q "^created web (size [0-9]*, 300 shards, window 4, lanes 2)$" || fail "put sharded"
"$PERMCTL" datasets get web --json | grep -qF '"shards":300,"window":4,"lanes":2' || fail "get --json"
"$PERMCTL" datasets get web | grep -qE "^web +[0-9]+ +4 +api +300 +4 +2$" || fail "get's table"

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
# and inverse takes them too: the ids fetched under window 9, lanes 3 map back to their positions there
"$PERMCTL" fetch web --seed 7 --epoch 2 --world 1 --rank 0 --mode exact --window 9 --lanes 3 --count 6 >"$DIR/ids6"
"$PERMCTL" inverse web --seed 7 --epoch 2 --world 1 --window 9 --lanes 3 $(cat "$DIR/ids6") | cut -d' ' -f1 \
  | tr '\n' ' ' | grep -qx "0 1 2 3 4 5 " || fail "inverse with window/lanes"
"$PERMCTL" inverse web --seed 7 --epoch 2 --world 1 $(cat "$DIR/ids6") | cut -d' ' -f1 | tr '\n' ' ' \
  | grep -qx "0 1 2 3 4 5 " && fail "inverse without the override gave the override's positions"

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

if [ "${PERMD_HAVE_IMPORT:-1}" = 0 ]; then # permctl built without jansson/libarchive (PERMD_IMPORT)
  echo "ok (--tars and --mds skipped: this permctl was built without them)"
  exit 0
fi

# WebDataset tars and an MDS index, as their writers lay them out (python3's tarfile and json build them)
python3 - "$DIR" <<'PY'
import io, json, os, sys, tarfile
d = sys.argv[1]
os.makedirs(f"{d}/wds"); os.makedirs(f"{d}/mds")
for i in range(10):  # shard i: 3 + i samples of .jpg + .cls, with a metadata member
    with tarfile.open(f"{d}/wds/shard-{i:06d}.tar", "w") as t:
        for n in ["__meta__"] + [f"s{i}_{k}.{e}" for k in range(3 + i) for e in ("jpg", "cls")]:
            ti = tarfile.TarInfo(n); ti.size = 100; t.addfile(ti, io.BytesIO(b"x" * 100))
shards = [{"column_encodings": ["int"], "column_names": ["x"], "column_sizes": [8], "compression": None,
           "format": "mds", "hashes": [], "raw_data": {"basename": f"shard.{i:05d}.mds", "bytes": 1000, "hashes": {}},
           "samples": 50 + i, "size_limit": 1 << 26, "version": 2, "zip_data": None} for i in range(20)]
json.dump({"shards": shards, "version": 2}, open(f"{d}/mds/index.json", "w"), sort_keys=True)
PY
tars="$DIR/wds/shard-{000000..000009}.tar"
"$PERMCTL" shards --tars "$tars" >"$DIR/wds.txt" 2>"$DIR/err" || fail "shards --tars: $(cat "$DIR/err")"
[ "$(cut -f1 "$DIR/wds.txt" | tr '\n' ' ')" = "3 4 5 6 7 8 9 10 11 12 " ] || fail "tar sample counts: $(cat "$DIR/wds.txt")"
[ "$(head -1 "$DIR/wds.txt" | cut -f2)" = "$DIR/wds/shard-000000.tar" ] || fail "shards prints the paths"
"$PERMCTL" datasets put wds --tars "$tars" --window 3 --lanes 2 \
  | grep -q "^created wds (size 75, 10 shards, window 3, lanes 2)$" || fail "put --tars"
wslice=(--seed 3 --epoch 1 --world 2 --rank 1 --mode exact)
"$PERMCTL" rank --tars "$tars" --window 3 --lanes 2 "${wslice[@]}" --locations >"$DIR/want"
"$PERMCTL" stream wds "${wslice[@]}" --locations >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "stream of a --tars dataset differs from the offline rank --tars"
"$PERMCTL" rank --shards-file "$DIR/wds.txt" --window 3 --lanes 2 "${wslice[@]}" --locations | cmp -s - "$DIR/want" \
  || fail "permctl shards' output read back as --shards-file differs"
# several SPECs: a directory and a pattern; a repeated put is idempotent
"$PERMCTL" datasets put wds2 --tars "$DIR/wds/shard-00000[0-4].tar" "$DIR/wds/shard-{000005..000009}.tar" \
  | grep -q "^created wds2 (size 75, 10 shards" || fail "put --tars with two SPECs"
"$PERMCTL" datasets put wds2 --tars "$DIR/wds" | grep -q "^exists wds2" || fail "put --tars DIR, the same layout"
# a SPEC before --tars would be read after its value, in another order: refused
rc=0; "$PERMCTL" rank "$DIR/wds/shard-000001.tar" --tars "$DIR/wds/shard-000000.tar" "${wslice[@]}" >/dev/null \
  2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] && grep -q "comes before --tars" "$DIR/err" || fail "a SPEC before --tars: rc=$rc $(cat "$DIR/err")"
# verify takes rank's SPECs, all of them (a second SPEC was read as the ids file); the ids by --ids or stdin
two=("$DIR/wds/shard-00000[0-4].tar" "$DIR/wds/shard-{000005..000009}.tar")
"$PERMCTL" rank --tars "${two[@]}" "${wslice[@]}" >"$DIR/ids2"
"$PERMCTL" verify --tars "${two[@]}" "${wslice[@]}" --ids "$DIR/ids2" | grep -q "^ok: $(wc -l <"$DIR/ids2") ids" || fail "verify --tars A B --ids"
"$PERMCTL" verify --tars "${two[@]}" "${wslice[@]}" <"$DIR/ids2" | grep -q "^ok: " || fail "verify --tars A B <ids"
rc=0; "$PERMCTL" verify --tars "${two[0]}" "${wslice[@]}" --ids "$DIR/ids2" >/dev/null || rc=$?
[ "$rc" = 1 ] || fail "verify --tars with one SPEC of two should mismatch (rc=$rc)"
rc=0; "$PERMCTL" verify --mds "$DIR/mds" "${wslice[@]}" --ids "$DIR/ids2" "$DIR/ids2" 2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] && grep -q "unexpected argument" "$DIR/err" || fail "an ids file twice: rc=$rc"
"$PERMCTL" datasets put mds --mds "$DIR/mds" | grep -q "^created mds (size 1190, 20 shards, window 8, lanes 1)$" \
  || fail "put --mds"
mslice=(--seed 5 --epoch 0 --world 4 --rank 3 --mode exact)
"$PERMCTL" fetch mds "${mslice[@]}" --count 100000 >"$DIR/ids"
"$PERMCTL" verify --mds "$DIR/mds/index.json" "${mslice[@]}" "$DIR/ids" | grep -q "^ok: " || fail "verify --mds"

# bad shards: a clear error naming the file, its PD_E* code, exit 1; the daemon keeps serving
expect_fail() { # expect_fail CODE TEXT permctl-args...
  local code=$1 text=$2; shift 2
  rc=0; "$PERMCTL" "$@" >/dev/null 2>"$DIR/err" || rc=$?
  [ "$rc" = 1 ] && grep -qF -- "$code" "$DIR/err" && grep -qF -- "$text" "$DIR/err" \
    || fail "$*: rc=$rc, want 1 with $code and '$text': $(cat "$DIR/err")"
}
expect_fail PD_ENOTFOUND "shard-000010.tar" datasets put bad --tars "$DIR/wds/shard-{000000..000010}.tar"
head -c 2000 "$DIR/wds/shard-000003.tar" >"$DIR/wds/cut.tar"
expect_fail PD_EIO "cut.tar: truncated" datasets put bad --tars "$DIR/wds/cut.tar"
expect_fail PD_EINVAL "bad.txt: not a tar" datasets put bad --tars "$DIR/bad.txt"
# a path's escape sequence (here one retitling the terminal) is shown as \xNN, never sent to the terminal raw
odd=$'x\e]0;owned\a.tar'
cp "$DIR/bad.txt" "$DIR/$odd"
expect_fail PD_EINVAL 'x\x1b]0;owned\x07.tar: not a tar' shards --tars "$DIR/$odd"
! grep -q $'\e' "$DIR/err" || fail "a raw escape byte reached stderr"
# a lone 0x9b (CSI to an 8-bit terminal) too, while well-formed UTF-8 (é) stays as it is
odd=$'caf\xc3\xa9\x9b2J.tar'
cp "$DIR/bad.txt" "$DIR/$odd"
expect_fail PD_EINVAL $'caf\xc3\xa9\\x9b2J.tar: not a tar' shards --tars "$DIR/$odd"
expect_fail PD_ENOTFOUND "matches no file" shards --tars "$DIR/wds/none-*.tar"
# one file listed twice, however spelled, would have its samples counted twice
expect_fail PD_EINVAL "shard 1 is $DIR/wds/shard-000000.tar (shard 0) again" \
  datasets put bad --tars "$DIR/wds/shard-000000.tar" "$DIR/wds/./shard-000000.tar"
expect_fail PD_EINVAL "again" datasets put bad --tars "$DIR/wds/shard-{000000,000000}.tar"
expect_fail PD_EINVAL "POSIX classes" shards --tars "$DIR/wds/shard-00000[[:digit:]].tar"
printf '{"version": 2, "shards": [' >"$DIR/mds/broken.json"
expect_fail PD_EINVAL "broken.json:1:" datasets put bad --mds "$DIR/mds/broken.json"
sed 's/"version": 2}$/"version": 3}/' "$DIR/mds/index.json" >"$DIR/mds/v3.json"
expect_fail PD_EUNSUPPORTED "v3.json" datasets put bad --mds "$DIR/mds/v3.json"
expect_fail PD_ETOOBIG "--max-shards" datasets put bad --tars "$tars" --max-shards 5
rc=0; "$PERMCTL" datasets put bad --tars "$tars" --mds "$DIR/mds" 2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] && grep -q "give one of" "$DIR/err" || fail "two sources: rc=$rc $(cat "$DIR/err")"
rc=0; "$PERMCTL" datasets get wds --tars "$tars" 2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] || fail "get with --tars: rc=$rc"
rc=0; "$PERMCTL" datasets get bad 2>/dev/null || rc=$?
[ "$rc" = 1 ] || fail "a failed put registered nothing"
"$PERMCTL" fetch wds "${wslice[@]}" --count 1 >/dev/null || fail "daemon stopped serving"
echo ok
