#!/usr/bin/env bash
# CLI test: runs the first console session of a document (docs/quickstart-daemon.md, README.md) verbatim,
# on permd's defaults, and diffs its output.
set -euo pipefail

BIN=${1:?usage: test_quickstart.sh BIN_DIR SOURCE_DIR [DOC]}
DOC=${2:?}/${3:-docs/quickstart-daemon.md}
SANDBOX=$(mktemp -d /tmp/permd-quickstart-XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$SANDBOX"
}
trap cleanup EXIT

# The defaults, inside a sandbox: the socket in $XDG_RUNTIME_DIR, the registry under $HOME.
mkdir -p "$SANDBOX/run" "$SANDBOX/home"
export XDG_RUNTIME_DIR="$SANDBOX/run" HOME="$SANDBOX/home" PATH="$BIN:$PATH"
unset PERMD_SOCKET XDG_STATE_HOME STATE_DIRECTORY

# Commands ("$ " lines) and their expected output from the first console block.
awk '/^```console$/{on=1; next} /^```$/{if (on) exit} on' "$DOC" >"$SANDBOX/session"
[ -s "$SANDBOX/session" ] || { echo "FAIL: no console block in $DOC" >&2; exit 1; }

run_pending() { # run the command collected so far and compare its output
  [ -n "${cmd:-}" ] || return 0
  local got
  got=$(bash -c "$cmd" 2>&1) || { echo "FAIL: '$cmd' exited non-zero: $got" >&2; exit 1; }
  if [ "$got" != "$want" ]; then
    printf 'FAIL: %s\n--- expected\n%s\n--- got\n%s\n' "$cmd" "$want" "$got" >&2
    exit 1
  fi
}

cmd=
want=
while IFS= read -r line; do
  if [[ "$line" == '$ '* ]]; then
    run_pending
    cmd=${line#\$ }
    want=
    if [ "$cmd" = "permd &" ]; then # start the daemon and wait for its socket
      permd 2>"$SANDBOX/permd.log" &
      PID=$!
      for _ in $(seq 200); do [ -S "$XDG_RUNTIME_DIR/permd.sock" ] && break; sleep 0.05; done
      cmd=
    elif [ "$cmd" = "kill %1" ]; then
      kill -TERM "$PID"
      rc=0
      wait "$PID" || rc=$?
      PID=
      [ "$rc" = 0 ] || { echo "FAIL: permd exited $rc" >&2; exit 1; }
      cmd=
    fi
  else
    want=${want:+$want$'\n'}$line
  fi
done <"$SANDBOX/session"
run_pending
[ -f "$HOME/.local/state/permd/registry.db" ] || { echo "FAIL: no registry in the default state dir" >&2; exit 1; }
echo ok
