#!/usr/bin/env bash
# Unpacks the Debian libraries permd's build and tests need into .carry/sysroot, for GPU machines that
# cannot install packages: carry .carry in the device call; tests/gpu/run.sh points the build there.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(libcmocka0 libcmocka-dev                           # tests
          libuv1 libuv1-dev libyaml-0-2 libyaml-dev libcyaml1 libcyaml-dev       # the daemon
          libprotobuf-c1 libprotobuf-c-dev protobuf-c-compiler libprotoc32 libprotobuf32
          libsqlite3-0 libsqlite3-dev pkgconf pkgconf-bin libpkgconf3
          libarchive13 libarchive-dev libjansson4 libjansson-dev     # permctl --tars, --mds (AUTO: if they link)
          "$@")
mkdir -p .carry/debs .carry/sysroot
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.carry/' "$exclude" 2>/dev/null || echo '/.carry/' >> "$exclude"
(cd .carry/debs && apt-get download "${PACKAGES[@]}" >/dev/null)
for deb in .carry/debs/*.deb; do dpkg-deb -x "$deb" .carry/sysroot; done
echo "sysroot: $(du -sh .carry/sysroot | cut -f1) in .carry/sysroot"
