#!/usr/bin/env bash
# Sets up (launch/setup.sh) and builds mltrain into build/, binaries in build/bin/: the targets
# named as arguments (the demo's: mltrain mlprep mlgen), or with none everything, the tests too.
# BUILD_TYPE (default Release: -O2 without debug information; RelWithDebInfo to debug) and
# MLTRAIN_HOME (default ~/.cache/mltrain) can be set.
# Warnings in the project's code are errors here, with the compiler setup.sh installs (CI builds
# through this script); a build by hand with another compiler keeps them warnings.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
bash launch/setup.sh
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DMLTRAIN_WERROR=ON \
  -DMLTRAIN_PYTHON="${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python" >build/cmake.log 2>&1 \
  || { cat build/cmake.log; exit 1; }
# What is left to build, and about how long it takes: the demo's 114 steps took 968 s of compile
# time (8.5 s of one core a step, 5.5 minutes on 2 cores) in a fresh clone with an empty compiler
# cache on a 2-core AMD EPYC (issue 46); about 10 s a step allows for a slower machine. Far less
# where the cache already holds them.
cores=$(nproc)
steps=$(ninja -C build -n "$@" | grep -c '^\[' || true)
if ((steps > 0)); then
  echo "[build] ${*:-everything}: $steps steps with $cores jobs, up to about" \
    "$(((steps * 10 / cores + 59) / 60)) minutes on a first build (ninja counts them below)"
fi
ninja -C build "$@"
