#!/usr/bin/env bash
# Load test: one permd, 1,000 concurrent verifying clients over the Unix socket, then over TCP loopback.
# Fails on any error; appends each run's figures to $LOAD_RESULTS (default: load-results.txt in the cwd).
# usage: run_load.sh BIN_DIR   (LOAD_SECONDS, LOAD_CLIENTS; PERMD_LONG_TESTS=1 runs 60 s per transport)
set -euo pipefail
bin=$1
clients=${LOAD_CLIENTS:-1000}
seconds=${LOAD_SECONDS:-10}
[ "${PERMD_LONG_TESTS:-0}" = 1 ] && seconds=${LOAD_SECONDS:-60}
results=${LOAD_RESULTS:-$PWD/load-results.txt}

# Each client is a descriptor in permd and one here.
need=$((clients + 256))
[ "$(ulimit -n)" -ge "$need" ] || ulimit -n "$need" || { echo "ulimit -n $need refused; raise the hard limit" >&2; exit 1; }

dir=$(mktemp -d /tmp/permd-load-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/permd" --socket "$dir/permd.sock" --state-dir "$dir/state" --tcp "127.0.0.1:$port" --metrics "" \
  --max-connections $((clients * 2)) --log-level warn 2>"$dir/permd.log" &
pid=$!
for _ in $(seq 100); do [ -S "$dir/permd.sock" ] && break; sleep 0.1; done
"$bin/permctl" datasets put load --size 10000000 --socket "$dir/permd.sock" >/dev/null

for transport in unix tcp; do
  if [ $transport = unix ]; then endpoint=(--unix "$dir/permd.sock"); else endpoint=(--tcp "127.0.0.1:$port"); fi
  line=$("$bin/permd_load" "${endpoint[@]}" --clients "$clients" --seconds "$seconds" --pid "$pid")
  echo "$line"
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $line" >> "$results"
done
"$bin/permctl" stats --socket "$dir/permd.sock" | sed -n '/^type/,$p'
kill -TERM "$pid"
wait "$pid"
status=$?
pid=
[ $status -eq 0 ] || { echo "permd exited $status" >&2; cat "$dir/permd.log" >&2; exit 1; }
if grep -q "level=error" "$dir/permd.log"; then cat "$dir/permd.log" >&2; exit 1; fi
echo "load: 2 transports, $clients clients each, 0 errors"
