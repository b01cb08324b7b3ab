#!/usr/bin/env bash
# Installs what is missing, builds permd if needed, and runs the daemon in the foreground on its defaults
# (Unix socket $XDG_RUNTIME_DIR/permd.sock or /tmp/permd-$UID/permd.sock, registry ~/.local/state/permd).
# Extra arguments go to permd (see build/bin/permd --help); Ctrl-C stops it cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x build/bin/permd ] || [ ! -x build/bin/permctl ]; then
  bash scripts/build.sh >&2
fi
exec build/bin/permd "$@"
