#!/usr/bin/env bash
# Unpacks the Debian libraries permd's tests need into .carry/sysroot, for GPU machines that cannot
# install packages: carry .carry in the device call and configure with
# -DCMAKE_PREFIX_PATH=$PWD/.carry/sysroot/usr, LD_LIBRARY_PATH=$PWD/.carry/sysroot/usr/lib/x86_64-linux-gnu.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(libcmocka0 libcmocka-dev "$@")
mkdir -p .carry/debs .carry/sysroot
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.carry/' "$exclude" 2>/dev/null || echo '/.carry/' >> "$exclude"
(cd .carry/debs && apt-get download "${PACKAGES[@]}" >/dev/null)
for deb in .carry/debs/*.deb; do dpkg-deb -x "$deb" .carry/sysroot; done
echo "sysroot: $(du -sh .carry/sysroot | cut -f1) in .carry/sysroot"
