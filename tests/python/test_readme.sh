#!/usr/bin/env bash
# Runs the README's PyTorch quick start (its first ```python block) exactly as printed.
set -euo pipefail
python=${1:?usage: test_readme.sh PYTHON README}
readme=${2:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/^```python$/{on=1; next} /^```$/{if (on) exit} on' "$readme" >"$tmp/quickstart.py"
[ -s "$tmp/quickstart.py" ] || { echo "FAIL: no python block in $readme" >&2; exit 1; }
cd "$tmp"
"$python" quickstart.py
