#!/usr/bin/env bash
# Builds permd if needed and runs an example: the first ids rank 0 of 4 reads in epoch 0.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/permctl ] || bash scripts/build.sh >&2
echo "permctl rank --seed 42 --epoch 0 --size 1000000 --world 4 --rank 0 --mode exact --count 10" >&2
exec build/bin/permctl rank --seed 42 --epoch 0 --size 1000000 --world 4 --rank 0 --mode exact --count 10
