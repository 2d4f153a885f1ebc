#!/usr/bin/env bash
# Sets up (launch/setup.sh) and builds mltrain into build/, binaries in build/bin/.
# BUILD_TYPE (default RelWithDebInfo) and MLTRAIN_HOME (default ~/.cache/mltrain) can be set.
# Warnings in the project's code are errors here, with the compiler setup.sh installs (CI builds
# through this script); a build by hand with another compiler keeps them warnings.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
bash launch/setup.sh
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DMLTRAIN_WERROR=ON \
  -DMLTRAIN_PYTHON="${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python" >build/cmake.log 2>&1 \
  || { cat build/cmake.log; exit 1; }
echo "[build] building with $(nproc) jobs (the first build takes several minutes)"
ninja -C build
