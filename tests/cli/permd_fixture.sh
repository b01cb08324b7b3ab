# Sourced by the CLI shell tests: a private permd on its own Unix socket for the test's lifetime.
#   source "$(dirname "$0")/permd_fixture.sh"; permd_fixture_start BIN_DIR NAME
# sets DIR (a temporary directory, removed at exit), PERMD, PERMCTL, PERMD_SOCKET (exported) and PID
# (permd's; a test that stops permd itself sets PID= after), and defines fail MESSAGE.
fail() { echo "FAIL: $*" >&2; exit 1; }

permd_fixture_cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$DIR"
}

permd_fixture_start() {
  local bin=$1 name=$2
  PERMD="$bin/permd"
  PERMCTL="$bin/permctl"
  DIR=$(mktemp -d "/tmp/permd-$name-XXXXXX")
  PID=
  trap permd_fixture_cleanup EXIT
  export PERMD_SOCKET="$DIR/permd.sock"
  "$PERMD" --state-dir "$DIR/state" 2>"$DIR/permd.log" &
  PID=$!
  for _ in $(seq 200); do [ -S "$PERMD_SOCKET" ] && break; sleep 0.05; done
  [ -S "$PERMD_SOCKET" ] || fail "permd did not start: $(cat "$DIR/permd.log")"
}
