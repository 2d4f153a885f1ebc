#!/usr/bin/env bash
# The newcomer's first command: sets up, builds, and shows what mltrain would train for the base
# config (the 0.04B MiniLLaMA): its parameters and FLOPs per token. Later versions of this script
# prepare the bundled corpus, train the smoke config on the CPU, evaluate and sample.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/launch/build.sh"
cd "$repo"
build/bin/mltrain configs/base.yaml --dry-run
