#!/usr/bin/env bash
# Runs docs/mixtures.md's Python blocks verbatim, each as its own script in a fresh directory: the daemon
# example against a real permd (PERMD_BIN) on a private socket given as $PERMD_SOCKET, then the PyTorch
# example, whose output must be what the page says it prints.
set -euo pipefail
src=${1:?usage: test_mixtures_doc.sh SOURCE_DIR}
doc=$src/docs/mixtures.md
py=${PERMD_PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/permd-mixdoc-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
block() { awk -v n="$1" '/^```python$/ {if (++k == n) {on = 1; next}} /^```$/ {if (on) exit} on' "$doc"; }
block 1 >"$work/daemon.py"
block 2 >"$work/example.py"
awk '/^It prints$/ {on = 1; next} on && /^    / {print substr($0, 5); next} on && NF {exit}' "$doc" >"$work/expected"
for f in daemon.py example.py expected; do
  [ -s "$work/$f" ] || { echo "FAIL: $doc lacks its $f block" >&2; exit 1; }
done
cd "$work"

"${PERMD_BIN:?}" --socket "$work/permd.sock" --state-dir "$work/state" --log-level warn 2>"$work/permd.log" &
pid=$!
for _ in $(seq 200); do [ -S "$work/permd.sock" ] && break; sleep 0.05; done
[ -S "$work/permd.sock" ] || { echo "FAIL: permd did not start" >&2; cat "$work/permd.log" >&2; exit 1; }
echo "== the daemon example"
PERMD_SOCKET=$work/permd.sock "$py" daemon.py || { echo "FAIL: docs/mixtures.md's daemon example" >&2; exit 1; }

echo "== the PyTorch example"
"$py" example.py | tee got
diff -u expected got || { echo "FAIL: the PyTorch example does not print what docs/mixtures.md says" >&2; exit 1; }
echo ok
