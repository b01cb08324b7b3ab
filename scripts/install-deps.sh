#!/usr/bin/env bash
# Installs the Debian packages permd's build, tests and benchmarks need; quiet and offline when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git      # toolchain
  libuv1-dev                                # daemon event loop
  libprotobuf-c-dev protobuf-c-compiler     # wire protocol
  libcyaml-dev                              # config file
  libsqlite3-dev                            # dataset registry
  libcmocka-dev                             # unit tests
  libsystemd-dev                            # sd_notify (Type=notify units, watchdog)
  libarchive-dev libjansson-dev             # permctl --tars (WebDataset shards) and --mds (MDS index.json)
  libsimde-dev                              # tests of the AVX-512 kernel on CPUs without AVX-512
  clang libclang-rt-14-dev                  # fuzzers (libFuzzer) and sanitizers
  valgrind                                  # leak checks
  python3 python3-numpy python3-torch       # Python package, its tests, peers in benchmarks
  python3-venv                              # the README's quick start and the install tests: venv + pip, offline
  python3-prometheus-client python3-yaml    # metrics exposition parser, deploy/ manifest checks
  systemd                                   # systemd-analyze verify of deploy/systemd
  redis-server redis-tools                  # the serve benchmark's peer
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
