#!/usr/bin/env bash
# The newcomer's first command, on a fresh CPU machine: sets up and builds mltrain, prepares the
# bundled demo corpus (English and Chinese fortunes from Debian packages) into data/demo/, trains
# the smoke config on the CPU into runs/smoke/ (replacing the previous demo run; about a minute),
# evaluates the trained weights, and prints samples from the model.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Only what the demo runs: the tests build with launch/test.sh.
bash "$repo/launch/build.sh" mltrain mlprep mlgen
cd "$repo"

step() { printf '\n== %s\n' "$*"; }

step "preparing the demo corpus into data/demo/"
mapfile -t fortunes < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)
build/bin/mlprep --input "${fortunes[@]}" --format fortune --vocab-size 4096 --out data/demo --overwrite

step "training configs/smoke.yaml into runs/smoke/"
# The demo trains from scratch each time (on a corpus just prepared anew): its previous run goes.
rm -rf runs/smoke
build/bin/mltrain configs/smoke.yaml

step "evaluating the newest checkpoint in runs/smoke/checkpoints/"
build/bin/mltrain configs/smoke.yaml --eval-only --resume auto

step "sampling from the trained model (temperature 0.8, the 50 most likely tokens)"
build/bin/mlgen runs/smoke --prompt "The computer " --max-new-tokens 48 --temperature 0.8 --top-k 50
build/bin/mlgen runs/smoke --prompt "春风" --max-new-tokens 32 --temperature 0.8 --top-k 50

step "done: metrics in runs/smoke/metrics.jsonl, loss curve in runs/smoke/loss.png"
