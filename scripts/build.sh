#!/usr/bin/env bash
# Configures and builds permd into build/ (Release, warnings as errors, the shard importers required); extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPERMD_WERROR=ON -DPERMD_IMPORT=ON "$@" >/dev/null
cmake --build build -j"$(nproc)"
