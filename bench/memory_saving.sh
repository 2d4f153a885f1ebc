#!/usr/bin/env bash
# What ZeRO-1 (dist.zero_stage 1) and activation checkpointing (train.activation_checkpointing)
# save and cost, on a model of about 300M parameters at 2 ranks on the CPU: each configuration
# against plain data parallelism, each run at two micro-batches, in a markdown table on stdout.
# It exits 1 when a run has no result.
#
#   bench/memory_saving.sh [--ranks R] [--steps N] [--model 300m|small] [--log FILE]
#
# Two passes. The memory pass runs each configuration at both micro-batches with glibc returning
# every freed block over 64 KiB to the system (MALLOC_MMAP_THRESHOLD_), so that the resident set
# follows the live tensors rather than what the allocator keeps for reuse; it reports
#   - the optimizer state per rank, as mltrain counts its tensors (metrics.jsonl's start record);
#   - rank 0's peak RSS over the training steps (mltrain's own peak_memory_bytes, before the final
#     checkpoint, whose gathering of a sharded state is not training);
#   - each rank's peak RSS over the whole process (bench/memory.sh --peak-of);
#   - the activation memory per micro-batch: the growth of rank 0's training peak from the smaller
#     micro-batch to the larger, scaled to the larger, which leaves out everything that does not
#     grow with the batch (weights, gradients, optimizer state, libraries).
# The time pass runs each configuration at the larger micro-batch, as it would run, twice, the
# configurations interleaved so that drift in the machine's speed falls on all; it reports the
# median step time after the first step, over both.
#
# Environment:
#   BENCH_SAVING_BATCHES  the two micro_batch x seq_len per rank (default "1x256 2x256")
#   BENCH_THREADS         CPU intra-op threads per rank (default all cores over the ranks)
#   BENCH_DATA            shards mltrain reads (default data/demo)
#   BENCH_RUN_TIMEOUT_S   seconds one run may take before it counts as failed (default 1800)
#   BENCH_MPIRUN          the mpirun (default mpirun, --bind-to none)
#   MLTRAIN_BIN_DIR       where mltrain is (default build/bin)
#   MLTRAIN_PYTHON        the Python that reads the metrics (default the project's venv, else python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ranks=2 steps=4 model=300m log=""
while (($# > 0)); do
  case $1 in
    --ranks) ranks=$2 ;;
    --steps) steps=$2 ;;
    --model) model=$2 ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
device=cpu
batches=${BENCH_SAVING_BATCHES:-1x256 2x256}
threads=${BENCH_THREADS:-$(($(nproc) / ranks > 0 ? $(nproc) / ranks : 1))}
run_timeout=${BENCH_RUN_TIMEOUT_S:-1800}
mpirun=${BENCH_MPIRUN:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# vocab_size d_model n_layers n_q_heads n_kv_heads head_dim d_ffn max_seq_len
case $model in
  300m) dims=(4096 1024 26 16 4 64 2816 1024) ;;  # 297M parameters
  small) dims=(4096 128 4 4 2 32 352 256) ;;
  *) echo "--model is 300m or small, not $model" >&2; exit 2 ;;
esac
# name and the settings that make it
configs=("plain:dist.zero_stage=0 train.activation_checkpointing=false"
  "zero1:dist.zero_stage=1 train.activation_checkpointing=false"
  "checkpointing:dist.zero_stage=0 train.activation_checkpointing=true")

work=$(mktemp -d /tmp/memory_saving.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${log:-$work/memory_saving.log}

# One run: name micro_batch seq_len settings... Prints "optimizer_bytes B", "train_peak B",
# "step_ms MS" and "rss_kib RANK KIB" per rank; its output goes to the log. MALLOC_MMAP_THRESHOLD_
# from the environment reaches every rank.
run() {
  local name=$1 micro=$2 seq=$3 run_dir=$work/run sets=() setting rank environment=()
  shift 3
  [[ -n ${MALLOC_MMAP_THRESHOLD_:-} ]] && environment=(-x MALLOC_MMAP_THRESHOLD_)
  rm -rf "$run_dir" "$work"/peak.*
  for setting in "$@" \
    model.vocab_size="${dims[0]}" model.d_model="${dims[1]}" model.n_layers="${dims[2]}" \
    model.n_q_heads="${dims[3]}" model.n_kv_heads="${dims[4]}" model.head_dim="${dims[5]}" \
    model.d_ffn="${dims[6]}" model.max_seq_len="${dims[7]}" \
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" data.tokenizer="$data/tokenizer.model" \
    data.seq_len="$seq" data.micro_batch="$micro" data.grad_accum=1 \
    train.device=cpu train.precision=fp32 train.threads="$threads" \
    train.max_steps="$steps" train.log_every=1 train.eval_every=1000000 train.eval_batches=1 \
    train.ckpt_every=1000000 train.stop_at="$steps" train.run_dir="$run_dir" optim.warmup_steps=1; do
    sets+=(--set "$setting")
  done
  timeout "$run_timeout" "$mpirun" --oversubscribe --bind-to none -n "$ranks" "${environment[@]}" \
    bash "$repo/bench/memory.sh" --peak-of "$work/peak" \
    "$bin_dir/mltrain" "$repo/configs/base.yaml" "${sets[@]}" >>"$log" 2>&1 || return
  "$python" - "$run_dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
start = next(r for r in rows if r.get("event") == "start")
print(f"optimizer_bytes {start['optimizer_state_bytes']}")
PY
  "$python" "$repo/bench/metrics_summary.py" "$run_dir/metrics.jsonl" --warmup 1 |
    sed -n 's/^peak_memory_bytes /train_peak /p; /^step_ms /p'
  for ((rank = 0; rank < ranks; ++rank)); do
    [[ -s $work/peak.$rank ]] && echo "rss_kib $rank $(cat "$work/peak.$rank")"
  done
  return 0
}

results=$work/results.txt
: >"$results"
failed=0
# One run, its figures appended to the results as "pass name batch key value...".
measure() {
  local pass=$1 name=$2 batch=$3 result="" settings
  read -r -a settings <<<"$4"
  echo "=== $pass: $name, $batch" >>"$log"
  result=$(run "$name" "${batch%x*}" "${batch#*x}" "${settings[@]}") ||
    { echo "=== failed" >>"$log"; failed=1; }
  printf '%s\n' "$result" >>"$log"
  [[ -z $result ]] && failed=1
  sed "s/^/$pass $name $batch /" <<<"$result" >>"$results"
  echo "[memory_saving] $pass: $name at $batch: $(tr '\n' ' ' <<<"${result:-no result (see the log)}")" >&2
}
echo "[memory_saving] $model model, $ranks rank(s) of $threads thread(s), $steps steps;" \
  "batches $batches; log: $log" >&2
for batch in $batches; do
  for config in "${configs[@]}"; do
    MALLOC_MMAP_THRESHOLD_=65536 measure memory "${config%%:*}" "$batch" "${config#*:}"
  done
done
large=${batches##* }
unset MALLOC_MMAP_THRESHOLD_  # the time pass runs as a user's run would, whatever this shell set
for round in 1 2; do
  for config in "${configs[@]}"; do
    measure "time$round" "${config%%:*}" "$large" "${config#*:}"
  done
done

"$python" - "$model" "$ranks" "$threads" "$steps" "$batches" "$results" <<'EOF' | tee -a "$log"
import statistics
import sys
model, ranks, threads, steps, batches, results = sys.argv[1:7]
small, large = batches.split()
tokens = {b: int(b.split("x")[0]) * int(b.split("x")[1]) for b in (small, large)}
memory, times = {}, {}
for line in open(results):
    words = line.split()
    if len(words) < 5:
        continue
    run, name, batch, key = words[0], words[1], words[2], words[3]
    if run.startswith("time"):
        if key == "step_ms":
            times.setdefault(name, []).append(float(words[4]))
        continue
    entry = memory.setdefault(name, {}).setdefault(batch, {"rss": {}})
    if key == "rss_kib" and len(words) == 6 and words[5].isdigit():
        entry["rss"][int(words[4])] = int(words[5]) * 1024
    elif key in ("optimizer_bytes", "train_peak"):
        entry[key] = float(words[4])
MiB = 2**20
def figure(name, batch, key):
    return memory.get(name, {}).get(batch, {}).get(key)
def activations(name):
    a, b = figure(name, small, "train_peak"), figure(name, large, "train_peak")
    if a is None or b is None:
        return None
    return (b - a) * tokens[large] / (tokens[large] - tokens[small])
def step(name):
    return statistics.median(times[name]) if times.get(name) else None
def show(value, scale=MiB):
    return "—" if value is None else f"{value / scale:,.0f}"
print(f"\n### ZeRO-1 and activation checkpointing: {model} model, CPU, fp32\n")
print(f"{ranks} ranks of {threads} thread(s), grad_accum 1, {steps} steps; memory in MiB (2^20 "
      f"bytes), with MALLOC_MMAP_THRESHOLD_=65536; step time without it, the median of the "
      f"steps after the first in two interleaved runs\n")
print(f"| configuration | optimizer state per rank | rank 0's training peak at {small} | "
      f"at {large} | process peak per rank at {large} | activations at {large} (growth of the "
      f"training peak) | step ms at {large} | step time vs plain |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name in ("plain", "zero1", "checkpointing"):
    rss = memory.get(name, {}).get(large, {}).get("rss", {})
    per_rank = ", ".join(show(rss[r]) for r in sorted(rss)) if rss else "—"
    ratio = f"{step(name) / step('plain'):.3f}x" if step(name) and step("plain") else "—"
    print(f"| {name} | {show(figure(name, large, 'optimizer_bytes'))} | "
          f"{show(figure(name, small, 'train_peak'))} | {show(figure(name, large, 'train_peak'))} | "
          f"{per_rank} | {show(activations(name))} | {show(step(name), 1)} | {ratio} |")
lines = []
plain_state, zero1_state = figure("plain", large, "optimizer_bytes"), figure("zero1", large, "optimizer_bytes")
if plain_state and zero1_state:
    lines.append(f"the optimizer state per rank falls {plain_state / zero1_state:.2f}x with ZeRO-1 at "
                 f"{ranks} ranks (goal: {ranks}x)")
if activations("plain") and activations("checkpointing"):
    lines.append(f"activation checkpointing cuts the activation memory "
                 f"{activations('plain') / activations('checkpointing'):.1f}x (goal: at least 3x)")
if step("checkpointing") and step("plain"):
    lines.append(f"for {100 * (step('checkpointing') / step('plain') - 1):.1f}% more step time "
                 f"(goal: under 40%)")
if step("zero1") and step("plain"):
    lines.append(f"ZeRO-1's step time is {step('zero1') / step('plain'):.3f}x plain's")
print("\n" + "; ".join(lines) + "." if lines else "\nNo pair of results (see the log).")
EOF

exit "$failed"
