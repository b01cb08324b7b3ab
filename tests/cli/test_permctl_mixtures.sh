#!/usr/bin/env bash
# CLI test: mixtures through permctl and a real permd — put, fetch and stream equal to the offline `permctl mix`,
# re-weighting by appending a stage (nothing before it changes), inverse, get/list/rm, and refusals.
set -euo pipefail

BIN=${1:?usage: test_permctl_mixtures.sh BIN_DIR}
source "$(dirname "$0")/permd_fixture.sh"
permd_fixture_start "$BIN" mix-cli

"$PERMCTL" datasets put books --size 3000 >/dev/null
"$PERMCTL" datasets put code --size 1000 >/dev/null
"$PERMCTL" mixtures put mix --components books,code --weights 3,1 | grep -q "^created mix: 2 components, length 4000" \
  || fail "mixtures put"
"$PERMCTL" mixtures put mix --components books,code --weights 3,1 | grep -q "^exists mix" || fail "put again"
"$PERMCTL" mixtures put mix --components books,code --weights 3,1 --json |
  grep -q '^{"mixture":{"name":"mix",.*},"created":false,"result":"exists"}$' || fail "put --json says what it did"

slice=(--seed 5 --epoch 1 --world 4 --rank 3 --mode pad)
"$PERMCTL" mix --sizes 3000,1000 --weights 3,1 "${slice[@]}" >"$DIR/want"
"$PERMCTL" fetch mix "${slice[@]}" --count 100000 >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "fetch differs from the offline mix"
"$PERMCTL" stream mix "${slice[@]}" --batch 77 >"$DIR/got"
cmp -s "$DIR/want" "$DIR/got" || fail "stream differs from the offline mix"

# Re-weight from run position 4000 + 1056 (epoch 1, offset 1056): appended; epoch 0 and the start of epoch 1 stay.
"$PERMCTL" fetch mix --seed 5 --epoch 1 --world 1 --rank 0 --mode exact --count 4000 >"$DIR/before"
"$PERMCTL" mixtures put mix --components books,code --weights 3,1 --stage 5056:1,1 | grep -q "^updated mix" \
  || fail "appending a stage"
"$PERMCTL" fetch mix --seed 5 --epoch 1 --world 1 --rank 0 --mode exact --count 4000 >"$DIR/after"
cmp -s <(head -n 1056 "$DIR/before") <(head -n 1056 "$DIR/after") || fail "a new stage changed what came before it"
cmp -s "$DIR/before" "$DIR/after" && fail "the new stage changed nothing after it"
"$PERMCTL" mix --sizes 3000,1000 --weights 3,1 --stage 5056:1,1 --seed 5 --epoch 1 --world 1 --rank 0 --mode exact \
  >"$DIR/want"
cmp -s "$DIR/want" "$DIR/after" || fail "after the stage, fetch differs from the offline mix"

# Inverse: a global id and its component epoch -> EPOCH POSITION RANK, as the offline mixture says.
read -r comp local cepoch < <("$PERMCTL" mix --sizes 3000,1000 --weights 3,1 --stage 5056:1,1 --seed 5 --epoch 1 \
  --world 1 --rank 0 --mode exact --offset 2000 --count 1 --locations)
global=$(( comp == 0 ? local : 3000 + local ))
[ "$("$PERMCTL" inverse mix --seed 5 --world 4 "$global:$cepoch")" = "1 2000 0" ] || fail "inverse on a mixture"
rc=0; "$PERMCTL" inverse mix --seed 5 --world 4 5:1:2 2>"$DIR/err" || rc=$?
[ "$rc" = 2 ] && grep -q "'5:1:2' is not SAMPLE:COMPONENT_EPOCH" "$DIR/err" || fail "inverse 5:1:2 (rc $rc): $(cat "$DIR/err")"
# the two forms mixed up: each says which kind the name is, in permctl's terms; a mix of forms, a bad name: exit 2
expect_inverse() { # expect_inverse RC TEXT permctl-inverse-args...
  local want=$1 text=$2; shift 2
  rc=0; "$PERMCTL" inverse "$@" >/dev/null 2>"$DIR/err" || rc=$?
  [ "$rc" = "$want" ] && grep -qF -- "$text" "$DIR/err" || fail "inverse $*: rc=$rc, want $want and '$text': $(cat "$DIR/err")"
}
expect_inverse 1 "'books' is a dataset: its inverse takes sample ids alone" books --seed 5 --world 4 7:0
expect_inverse 1 "'mix' is a mixture: its inverse takes each global id with its component epoch" mix --seed 5 \
  --epoch 1 --world 4 7
expect_inverse 1 "no dataset or mixture named 'nope'" nope --seed 5 --world 4 7:0
expect_inverse 2 "not both ('7:0', '8')" mix --seed 5 --world 4 7:0 8
expect_inverse 2 "is not a name" 'bad name' --seed 5 --world 4 7:0
# get and rm of a name of the other kind say which kind it is
for args in "datasets get mix" "datasets rm mix" "mixtures get books" "mixtures rm books" "mixtures get nope"; do
  rc=0; "$PERMCTL" $args >/dev/null 2>"$DIR/err" || rc=$?
  case $args in
    datasets*mix) want="'mix' is a mixture, not a dataset (permctl mixtures ... mix)" ;;
    mixtures*books) want="'books' is a dataset, not a mixture (permctl datasets ... books)" ;;
    *) want="no dataset or mixture named 'nope'" ;;
  esac
  [ "$rc" = 1 ] && grep -qF "NOT_FOUND: $want" "$DIR/err" || fail "$args: rc=$rc $(cat "$DIR/err")"
done
"$PERMCTL" datasets get books >/dev/null || fail "mixtures rm books removed the dataset"
"$PERMCTL" mixtures get mix >/dev/null || fail "datasets rm mix removed the mixture"

"$PERMCTL" mixtures get mix --json | grep -qF '"stages":[{"start":0,"weights":[3,1]},{"start":5056,"weights":[1,1]}]' \
  || fail "get --json"
[ "$("$PERMCTL" mixtures list)" = "mix" ] || fail "list"

# Refusals: a component in use, a stage off the block, a changed stage, names taken, a missing component.
set +e
"$PERMCTL" datasets rm code 2>"$DIR/err"; [ $? -eq 1 ] && grep -q "component of mixture 'mix'" "$DIR/err" || fail "rm a component"
"$PERMCTL" mixtures put bad --components books,code --weights 3,1 --stage 100:1,1 2>"$DIR/err"
[ $? -eq 1 ] && grep -q "INVALID_ARGUMENT" "$DIR/err" && grep -q "stage 1 starts at 100" "$DIR/err" \
  || fail "a stage off the block (and which rule it breaks)"
"$PERMCTL" mixtures put mix --components books,code --weights 2,1 2>"$DIR/err"
[ $? -eq 1 ] && grep -q "CONFLICT" "$DIR/err" || fail "a changed definition"
"$PERMCTL" mixtures put books --components books,code --weights 1,1 2>"$DIR/err"
[ $? -eq 1 ] && grep -q "is a dataset" "$DIR/err" || fail "a dataset's name"
"$PERMCTL" mixtures put m2 --components books,nope --weights 1,1 2>"$DIR/err"
[ $? -eq 1 ] && grep -q "NOT_FOUND" "$DIR/err" || fail "a missing component"
"$PERMCTL" mixtures put m2 --components books --weights 1,1 2>"$DIR/err"
[ $? -eq 2 ] || fail "weights that do not match the components"
set -e
"$PERMCTL" mixtures rm mix | grep -q "^deleted mix$" || fail "rm"
"$PERMCTL" datasets rm code >/dev/null || fail "rm a component once its mixture is gone"
echo "test_permctl_mixtures: passed"
