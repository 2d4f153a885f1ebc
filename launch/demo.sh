#!/usr/bin/env bash
# The newcomer's first command: sets up, builds, prepares the bundled demo corpus (English and
# Chinese fortunes from Debian packages) into data/demo/, and shows what mltrain would train for
# the base config (the 0.04B MiniLLaMA): its parameters and FLOPs per token. Training the smoke
# config on the CPU, evaluation and sampling join this script as they land.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/launch/build.sh"
cd "$repo"

mapfile -t fortunes < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)
build/bin/mlprep --input "${fortunes[@]}" --format fortune --vocab-size 4096 --out data/demo
build/bin/mltrain configs/base.yaml --dry-run
