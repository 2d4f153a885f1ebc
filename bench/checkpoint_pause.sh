#!/usr/bin/env bash
# How long training stops at a checkpoint: configs/base.yaml's model trained with a checkpoint
# every few steps, the write synchronous (train.async_checkpoint=false) against in the background
# (true), interleaved over repetitions; a markdown table on stdout. It exits 1 when a run fails.
#
#   bench/checkpoint_pause.sh [--device cpu|cuda] [--reps N] [--steps N] [--every N] [--log FILE]
#
# (defaults: 3 repetitions of 16 steps, a checkpoint every 5).
#
# Per run, from its metrics.jsonl: the pause of each checkpoint but the last, whose write the end
# of the run waits for either way (checkpoint_pause_ms: the ranks' weight check, the state's
# gathering, and either the whole write or the copy to host memory after any wait for the write
# before); the median time of the step after a checkpoint, which a background write shares the
# cores with, and of the other steps; and the run's wall time to its last step.
#
# Environment:
#   BENCH_CKPT_BATCH     micro_batch x seq_len, grad_accum 1 (default 2x256 on the CPU, 16x1024
#                        on a GPU)
#   BENCH_THREADS        CPU intra-op threads (default all cores)
#   BENCH_CKPT_DIR       where the run directories go (default a new folder under /tmp; the
#                        disk's speed is part of the pause)
#   BENCH_DATA, MLTRAIN_BIN_DIR, MLTRAIN_PYTHON  as bench/environment.sh says
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=cpu reps=3 steps=16 every=5 log=""
while (($# > 0)); do
  case $1 in
    --device) device=$2 ;;
    --reps) reps=$2 ;;
    --steps) steps=$2 ;;
    --every) every=$2 ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
default_batch=2x256
[[ $device == cuda ]] && default_batch=16x1024
batch=${BENCH_CKPT_BATCH:-$default_batch}
threads=${BENCH_THREADS:-$(nproc)}
work=${BENCH_CKPT_DIR:-$(mktemp -d /tmp/checkpoint-pause.XXXXXX)}
mkdir -p "$work"
log=${log:-$work/checkpoint_pause.log}
precision=fp32
[[ $device == cuda ]] && precision=bf16

for ((rep = 1; rep <= reps; ++rep)); do
  for async in false true; do
    run_dir=$work/run-$async-$rep
    rm -rf "$run_dir"
    echo "=== rep $rep, train.async_checkpoint=$async" >>"$log"
    "$bin_dir/mltrain" "$repo/configs/base.yaml" \
      --set data.train="$data/train_*.bin" --set data.val="$data/val_*.bin" \
      --set data.tokenizer="$data/tokenizer.model" \
      --set data.micro_batch="${batch%x*}" --set data.seq_len="${batch#*x}" \
      --set data.grad_accum=1 --set train.device="$device" --set train.precision="$precision" \
      --set train.threads="$threads" --set train.max_steps="$steps" --set train.log_every=1 \
      --set train.eval_every=1000000 --set train.ckpt_every="$every" --set train.keep_last=2 \
      --set optim.warmup_steps=1 \
      --set train.async_checkpoint="$async" --set train.run_dir="$run_dir" >>"$log" 2>&1 ||
      { echo "[checkpoint_pause] run $run_dir failed; see $log" >&2; exit 1; }
    echo "[checkpoint_pause] rep $rep, async $async: done" >&2
  done
done

"$python" - "$work" "$reps" "$steps" "$every" "$device" "$batch" "$threads" <<'PY' | tee -a "$log"
import json, statistics, sys
work, reps, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
device, batch, threads = sys.argv[5:]

def figures(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl") if line.strip()]
    pauses = {r["step"]: r["checkpoint_pause_ms"] for r in rows if "checkpoint_pause_ms" in r}
    last = max(pauses)
    timed = [r for r in rows if "step_ms" in r and r["step"] > 1]
    # A background write runs beside the steps after its checkpoint, until the next one.
    beside = [r["step_ms"] for r in timed if r["step"] - 1 in pauses and r["step"] - 1 != last]
    alone = [r["step_ms"] for r in timed if r["step"] - 1 not in pauses]
    elapsed = max(r["elapsed_s"] for r in rows if "elapsed_s" in r)
    return [p for s, p in pauses.items() if s != last], beside, alone, elapsed

print(f"checkpoint pause, configs/base.yaml's model on {device} ({batch}, {threads} threads), "
      f"{steps} steps with a checkpoint every {every}, {reps} interleaved repetitions; medians\n")
print("| train.async_checkpoint | pause per checkpoint (ms) | step after a checkpoint (ms) "
      "| other steps (ms) | run to its last step (s) |")
print("| --- | ---: | ---: | ---: | ---: |")
medians = {}
for mode in ("false", "true"):
    runs = [figures(f"{work}/run-{mode}-{rep}") for rep in range(1, reps + 1)]
    pause = statistics.median(p for r in runs for p in r[0])
    beside = statistics.median(s for r in runs for s in r[1])
    alone = statistics.median(s for r in runs for s in r[2])
    elapsed = statistics.median(r[3] for r in runs)
    medians[mode] = (pause, elapsed)
    print(f"| {mode} | {pause:.0f} | {beside:.0f} | {alone:.0f} | {elapsed:.1f} |")
print(f"\nasynchronous / synchronous: pause {medians['true'][0] / medians['false'][0]:.3f}, "
      f"run {medians['true'][1] / medians['false'][1]:.3f}")
PY
