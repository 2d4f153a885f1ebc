#!/usr/bin/env bash
# Time to a target loss: a config's model and recipe (configs/smoke.yaml on the CPU by default)
# trained by mltrain with AdamW, by mltrain with Muon (optim.name muon, its defaults), and by an
# independent PyTorch eager reference with AdamW (bench/time_to_loss_reference.py), each for three
# seeds (data.seed: the initial weights and the sample order), interleaved, validated every 10
# steps on the same windows; fp32 on the CPU, bf16 on CUDA.
# Prints a markdown table (bench/time_to_loss_report.py): each one's final validation loss, and the
# steps and wall time each takes to reach the AdamW run's final validation loss of the same seed;
# and draws every validation curve into OUT/time_to_loss.png. It exits 1 when a run fails.
#
#   bench/time_to_loss.sh [--device cpu|cuda] [--config FILE] [--seeds "1 2 3"] [--steps N]
#                         [--eval-every N] [--set KEY=VALUE ...] [--out DIR]
#
# (defaults: cpu, configs/smoke.yaml, seeds 1 2 3, 160 steps, validation every 10 steps, a new
# folder under /tmp; --set, repeatable, changes the recipe of every run; bench/gpu.sh runs it on
# the base config).
#
# Environment:
#   BENCH_THREADS  CPU intra-op threads (default all cores)
#   BENCH_DATA, MLTRAIN_BIN_DIR, MLTRAIN_PYTHON  as bench/environment.sh says; the default data,
#                  data/demo, is prepared from the Debian fortunes as launch/demo.sh does when it
#                  is not there
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=cpu config=$repo/configs/smoke.yaml seeds="1 2 3" steps=160 eval_every=10 out="" changes=()
while (($# > 0)); do
  case $1 in
    --device) device=$2 ;;
    --config) config=$2 ;;
    --eval-every) eval_every=$2 ;;
    --set) changes+=(--set "$2") ;;
    --seeds) seeds=$2 ;;
    --steps) steps=$2 ;;
    --out) out=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
threads=${BENCH_THREADS:-$(nproc)}
precision=fp32
[[ $device == cuda ]] && precision=bf16
out=${out:-$(mktemp -d /tmp/time-to-loss.XXXXXX)}
mkdir -p "$out"

if ! compgen -G "$data/train_*.bin" >/dev/null && [[ $data == "$repo/data/demo" ]]; then
  mapfile -t fortunes < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)
  "$bin_dir/mlprep" --input "${fortunes[@]}" --format fortune --vocab-size 4096 --out "$data"
fi

# Each seed begins with the next of the three, so that none always runs first, on a machine that the
# first run warms up (a GPU's clocks, the caches) or one that drifts.
optimizers=(adamw muon reference)
first=0
for seed in $seeds; do
  order=("${optimizers[@]:first}" "${optimizers[@]:0:first}")
  first=$(((first + 1) % ${#optimizers[@]}))
  recipe=(--set data.train="$data/train_*.bin" --set data.val="$data/val_*.bin"
    --set data.tokenizer="$data/tokenizer.model" --set data.seed="$seed"
    --set train.max_steps="$steps" --set train.device="$device" --set train.precision="$precision"
    --set train.threads="$threads" --set train.log_every="$eval_every"
    --set train.eval_every="$eval_every" --set train.ckpt_every=1000000 "${changes[@]}")
  for optimizer in "${order[@]}"; do
    run_dir=$out/${optimizer}_$seed
    rm -rf "$run_dir"
    echo "seed $seed: $optimizer" >&2
    if [[ $optimizer == reference ]]; then
      "$bin_dir/mltrain" "$config" "${recipe[@]}" --dump-config >"$run_dir.yaml"
      "$python" "$repo/bench/time_to_loss_reference.py" --config "$run_dir.yaml" --out "$run_dir" \
        --threads "$threads" >"$run_dir.log" 2>&1 || { cat "$run_dir.log" >&2; exit 1; }
    else
      "$bin_dir/mltrain" "$config" "${recipe[@]}" --set optim.name="$optimizer" \
        --set train.run_dir="$run_dir" >"$run_dir.log" 2>&1 || { cat "$run_dir.log" >&2; exit 1; }
    fi
  done
done
"$python" "$repo/bench/time_to_loss_report.py" "$out" "$seeds" "$(basename "$config") on $device, $precision"
