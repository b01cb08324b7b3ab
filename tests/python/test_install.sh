#!/usr/bin/env bash
# `pip install ./python` must work offline: into a fresh venv (seeing Debian's numpy and torch), with
# no index at all, then the installed package imports from elsewhere and finds its bundled libpermd.
set -euo pipefail
python=${1:?usage: test_install.sh PYTHON SOURCE_DIR LIBPERMD}
src=${2:?}
lib=${3:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --system-site-packages "$tmp/venv"
PERMD_LIB="$lib" "$tmp/venv/bin/python" -m pip install -q --no-index --no-cache-dir "$src/python"
cd "$tmp"
env -u PERMD_LIB -u PYTHONPATH "$tmp/venv/bin/python" - <<'PY'
import os
import permd
assert os.path.dirname(permd.__file__).startswith(os.getcwd()), permd.__file__
assert permd.Permutation(7, 0, 5)[:].tolist() == [4, 1, 2, 3, 0]
print("installed:", permd.__file__)
PY
