#!/usr/bin/env bash
# Runs the README's PyTorch quick start exactly as printed, in a copy of a fresh clone's files (python/ and
# the built build/lib/libpermd.so), on the machine the README warns about: `python3` and `python` first on
# PATH are an interpreter without torch (as pyenv's or conda's often are). Its ```python block is saved as
# quickstart.py; its first ```sh block (Debian's Python) runs as is; then its second (an environment that
# already has torch) runs in an activated virtualenv that has torch. Neither sees PYTHONPATH or PERMD_LIB.
set -euo pipefail
src=${1:?usage: test_readme.sh SOURCE_DIR LIBPERMD}
lib=${2:?}
readme=$src/README.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

section() { awk '/^## PyTorch quick start$/ {on = 1; next} /^## / {on = 0} on' "$readme"; }
block() { # block LANG N: the section's Nth ```LANG block
  section | awk -v fence='```'"$1" -v n="$2" '$0 == fence {if (++k == n) {on = 1; next}} /^```$/ {if (on) exit} on'
}

clone=$tmp/clone
mkdir -p "$clone/build/lib"
cp -r "$src/python" "$clone/python"
find "$clone/python" -name __pycache__ -prune -exec rm -rf {} +
cp "$lib" "$clone/build/lib/libpermd.so"
block python 1 >"$clone/quickstart.py"
block sh 1 >"$tmp/debian.sh"
block sh 2 >"$tmp/existing.sh"
for f in "$clone/quickstart.py" "$tmp/debian.sh" "$tmp/existing.sh"; do
  [ -s "$f" ] || { echo "FAIL: a block of the PyTorch quick start is missing in $readme" >&2; exit 1; }
done

# pyenv's python3 stand-in: Debian's interpreter installed under another prefix, so that neither it nor a
# virtualenv made from it (--system-site-packages included) sees Debian's site packages
bare=$tmp/bare
py=python$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
mkdir -p "$bare/bin" "$bare/lib/$py"
cp "$(readlink -f /usr/bin/python3)" "$bare/bin/python3"
ln -s python3 "$bare/bin/python"
for entry in "/usr/lib/$py"/*; do
  [ "${entry##*/}" = dist-packages ] || ln -s "$entry" "$bare/lib/$py/"
done
"$bare/bin/python3" -m venv --without-pip --system-site-packages "$tmp/probe"
if "$tmp/probe/bin/python" -c 'import torch' 2>/dev/null || "$bare/bin/python3" -c 'import numpy' 2>/dev/null; then
  echo "FAIL: the stand-in python3 sees torch or numpy; the test would prove nothing" >&2; exit 1
fi
cd "$clone"
echo "== README, Debian's Python (python3 on PATH has no torch)"
env -u PYTHONPATH -u PERMD_LIB PATH="$bare/bin:$PATH" bash -euo pipefail "$tmp/debian.sh"

echo "== README, an environment that already has torch"
rm -rf .venv
/usr/bin/python3 -m venv --system-site-packages "$tmp/withtorch"
env -u PYTHONPATH -u PERMD_LIB PATH="$bare/bin:$PATH" \
  bash -euo pipefail -c '. "$1/bin/activate" && . "$2"' _ "$tmp/withtorch" "$tmp/existing.sh"
"$tmp/withtorch/bin/python" -c 'import os, permd; assert "withtorch" in permd.__file__, permd.__file__'
