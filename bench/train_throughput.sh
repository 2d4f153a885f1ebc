#!/usr/bin/env bash
# Training throughput side by side: mltrain against the same model and step in PyTorch
# (bench/reference_train.py), eager and under torch.compile, on the same device, precision,
# batch and thread count. The three run in turn, repetition after repetition, so that the
# machine's drift touches all alike; each run's figure is the median tokens/s of its steps after
# the warm-up, and the markdown table on stdout gives the median over repetitions, the spread and
# the ratios mltrain/eager and mltrain/compile. It exits 1 when a variant has no result.
#
#   bench/train_throughput.sh [--device cpu|cuda] [--model base|small] [--precision bf16|fp32]
#                             [--steps N] [--warmup N] [--reps N] [--log FILE]
#
# base is configs/base.yaml's model and batch (16 x 4 x 1024 tokens; on the CPU 2 x 1 x 256, by
# default), small is configs/smoke.yaml's (16 x 2 x 128). Environment:
#   BENCH_SEQ_LEN, BENCH_MICRO_BATCH, BENCH_GRAD_ACCUM  another batch than the model's default
#   BENCH_THREADS    CPU intra-op threads of every run (default: all cores)
#   BENCH_VARIANTS   which to run (default "mltrain eager compile")
#   BENCH_BUDGET_S   seconds for the whole benchmark: runs are cut off there (default: no limit)
#   BENCH_DATA       shards mltrain reads (default bench/gpu-packages/shards, else data/demo);
#                    the reference draws random tokens
#   MLTRAIN_BIN_DIR  where mltrain is (default build/bin)
#   MLTRAIN_PYTHON   the Python with torch (default the project's venv, else python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=cpu model=small precision=fp32 steps=20 warmup=3 reps=3 log=""
while (($# > 0)); do
  case $1 in
    --device) device=$2 ;;
    --model) model=$2 ;;
    --precision) precision=$2 ;;
    --steps) steps=$2 ;;
    --warmup) warmup=$2 ;;
    --reps) reps=$2 ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

python=${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python
[[ -x $python ]] || python=$(command -v python3)
python=${MLTRAIN_PYTHON:-$python}
bin_dir=${MLTRAIN_BIN_DIR:-$repo/build/bin}
data=$repo/bench/gpu-packages/shards
[[ -d $data ]] || data=$repo/data/demo
data=${BENCH_DATA:-$data}
threads=${BENCH_THREADS:-$(nproc)}
variants=${BENCH_VARIANTS:-mltrain eager compile}
budget=${BENCH_BUDGET_S:-0}

# vocab_size d_model n_layers n_q_heads n_kv_heads head_dim d_ffn; seq_len micro_batch grad_accum
case $model in
  base) dims=(4096 512 12 8 2 64 1408); batch=(1024 16 4); [[ $device == cpu ]] && batch=(256 2 1) ;;
  small) dims=(4096 128 4 4 2 32 352); batch=(128 16 2) ;;
  *) echo "--model is base or small, not $model" >&2; exit 2 ;;
esac
seq_len=${BENCH_SEQ_LEN:-${batch[0]}}
micro_batch=${BENCH_MICRO_BATCH:-${batch[1]}}
grad_accum=${BENCH_GRAD_ACCUM:-${batch[2]}}
tokens_per_step=$((micro_batch * grad_accum * seq_len))

work=$(mktemp -d /tmp/train_throughput.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${log:-$work/throughput.log}
start_s=$SECONDS

# Runs "$@" within what is left of the budget, if there is one.
bounded() {
  if ((budget > 0)); then timeout "$((budget - (SECONDS - start_s)))" "$@"; else "$@"; fi
}

run_mltrain() {
  local run_dir=$work/mltrain_run last=$((warmup + steps)) sets=() setting
  rm -rf "$run_dir"
  for setting in \
    model.vocab_size="${dims[0]}" model.d_model="${dims[1]}" model.n_layers="${dims[2]}" \
    model.n_q_heads="${dims[3]}" model.n_kv_heads="${dims[4]}" model.head_dim="${dims[5]}" \
    model.d_ffn="${dims[6]}" model.max_seq_len="$seq_len" \
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" data.tokenizer="$data/tokenizer.model" \
    data.seq_len="$seq_len" data.micro_batch="$micro_batch" data.grad_accum="$grad_accum" \
    train.device="$device" train.precision="$precision" train.threads="$threads" \
    train.max_steps="$last" train.log_every=1 train.eval_every="$last" train.eval_batches=1 \
    train.ckpt_every="$last" train.run_dir="$run_dir" optim.warmup_steps=1; do
    sets+=(--set "$setting")
  done
  bounded "$bin_dir/mltrain" "$repo/configs/base.yaml" "${sets[@]}" || return
  "$python" - "$run_dir/metrics.jsonl" "$warmup" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > int(sys.argv[2])]
print(f"tokens_per_s {statistics.median(rates):.1f}")
EOF
}

run_reference() {
  local flags=(--device "$device" --precision "$precision" --threads "$threads" --steps "$steps"
    --warmup "$warmup" --vocab-size "${dims[0]}" --d-model "${dims[1]}" --n-layers "${dims[2]}"
    --n-q-heads "${dims[3]}" --n-kv-heads "${dims[4]}" --head-dim "${dims[5]}" --d-ffn "${dims[6]}"
    --seq-len "$seq_len" --micro-batch "$micro_batch" --grad-accum "$grad_accum")
  [[ $1 == compile ]] && flags+=(--compile)
  PYTHONUNBUFFERED=1 bounded "$python" "$repo/bench/reference_train.py" "${flags[@]}"
}

# One run, its output appended to the log; prints its tokens/s, or nothing when it failed or the
# budget has no time left for it.
measure() {
  local variant=$1 rep=$2 output rc=0
  if ((budget > 0 && budget - (SECONDS - start_s) < 10)); then
    echo "=== $variant, repetition $rep: not run, the ${budget} s budget is spent" >>"$log"
    return
  fi
  echo "=== $variant, repetition $rep" >>"$log"
  case $variant in
    mltrain) output=$(run_mltrain 2>&1) || rc=$? ;;
    eager | compile) output=$(run_reference "$variant" 2>&1) || rc=$? ;;
    *) echo "unknown variant $variant in BENCH_VARIANTS" >&2; exit 2 ;;
  esac
  printf '%s\n' "$output" >>"$log"
  if ((rc != 0)); then
    echo "=== $variant failed with exit code $rc$( ((rc == 124)) && echo ', out of time')" >>"$log"
    return
  fi
  sed -n 's/^tokens_per_s //p' <<<"$output" | tail -1
}

declare -A rates
echo "[train_throughput] $model model on $device, $precision, $tokens_per_step tokens per step," \
  "$steps timed steps after $warmup, $reps repetitions; log: $log" >&2
for ((rep = 1; rep <= reps; ++rep)); do
  for variant in $variants; do
    rate=$(measure "$variant" "$rep")
    [[ -n $rate ]] && rates[$variant]+="$rate "
    echo "[train_throughput] repetition $rep, $variant: ${rate:-no result (see the log)} tokens/s" >&2
  done
done

"$python" - "$model" "$device" "$precision" "$tokens_per_step" "$steps" "$warmup" "$threads" \
  "$variants" "${rates[mltrain]:-}" "${rates[eager]:-}" "${rates[compile]:-}" <<'EOF' | tee -a "$log"
import statistics, sys
model, device, precision, tokens, steps, warmup, threads, variants = sys.argv[1:9]
names = ["mltrain", "PyTorch eager", "PyTorch torch.compile"]
runs = {name: [float(x) for x in values.split()]
        for name, variant, values in zip(names, ["mltrain", "eager", "compile"], sys.argv[9:12])
        if variant in variants.split()}
print(f"\n### Training throughput: {model} model, {device}, {precision}\n")
print(f"{tokens} tokens per step, {threads} CPU threads; a run's figure is the median of its "
      f"{steps} steps after {warmup} warm-up steps\n")
print("| implementation | tokens/s, median of runs | spread, min to max | runs |")
print("| --- | ---: | ---: | ---: |")
medians = {}
for name, values in runs.items():
    if not values:
        print(f"| {name} | no result | | 0 |")
        continue
    medians[name] = statistics.median(values)
    spread = (max(values) - min(values)) / medians[name] * 100
    print(f"| {name} | {medians[name]:,.0f} | {min(values):,.0f} to {max(values):,.0f} "
          f"({spread:.1f}%) | {len(values)} |")
ratios = [f"mltrain/{short}: {medians['mltrain'] / medians[other]:.2f}x"
          for short, other in [("eager", names[1]), ("compile", names[2])]
          if "mltrain" in medians and other in medians]
print("\n" + ("; ".join(ratios) if ratios else "no ratio: mltrain or both references have no result"))
EOF

# A variant without a result fails the benchmark, after its table.
for variant in $variants; do
  [[ -n ${rates[$variant]:-} ]] || exit 1
done
