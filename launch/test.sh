#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (ctest: unit, reference-parity and command-line
# tests). Extra arguments go to ctest, e.g. `bash launch/test.sh -R Safetensors`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/launch/build.sh"
cd "$repo/build"
ctest --output-on-failure -j "$(nproc)" "$@"
