#!/usr/bin/env bash
# Data-parallel scaling on the CPU: mltrain as one rank with R intra-op threads against R MPI ranks
# of one thread each (mpirun, the gradients all-reduced over MPI), at the same global batch, with
# the all-reduce overlapped with backward (dist.overlap=true) and after it (false). The R ranks
# split the global batch: each takes micro_batch / R sequences, or grad_accum / R micro-steps where
# the micro-batch does not divide. The configurations run in turn, repetition after
# repetition; each run's figure is the median tokens/s (mltrain logs the global rate) of its steps
# after the warm-up, and the markdown table on stdout gives the median over repetitions, the spread,
# the step time and the ratio to one rank (the target: 0.95 or more). A fourth configuration, one
# rank of one thread training one rank's share of the batch, measures what the split alone costs:
# R times its tokens/s is what R ranks would reach if the all-reduce took no time. It exits 1 when
# a configuration has no result.
#
#   bench/allreduce.sh [--model base|small] [--ranks R] [--steps N] [--warmup N] [--reps N]
#                      [--log FILE]
#
# base is configs/base.yaml's model at bench/train_throughput.sh's CPU batch (2 x 1 x 256), small
# configs/smoke.yaml's (16 x 2 x 128); R is 2 by default. Environment:
#   BENCH_SEQ_LEN, BENCH_MICRO_BATCH, BENCH_GRAD_ACCUM  another global batch (one rank's)
#   BENCH_DATA       shards mltrain reads (default bench/gpu-packages/shards, else data/demo)
#   BENCH_RUN_TIMEOUT_S  seconds one run may take before it counts as failed (default 900)
#   BENCH_MPIRUN     the mpirun (default mpirun); BENCH_MPI_BIND its --bind-to (default none, as
#                    launch/local_ranks.sh)
#   MLTRAIN_BIN_DIR  where mltrain is (default build/bin)
#   MLTRAIN_PYTHON   the Python that reads the metrics (default the project's venv, else python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=base ranks=2 steps=10 warmup=3 reps=3 log=""
while (($# > 0)); do
  case $1 in
    --model) model=$2 ;;
    --ranks) ranks=$2 ;;
    --steps) steps=$2 ;;
    --warmup) warmup=$2 ;;
    --reps) reps=$2 ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
run_timeout=${BENCH_RUN_TIMEOUT_S:-900}
mpirun=${BENCH_MPIRUN:-mpirun}
bind=${BENCH_MPI_BIND:-none}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# vocab_size d_model n_layers n_q_heads n_kv_heads head_dim d_ffn; seq_len micro_batch grad_accum
case $model in
  base) dims=(4096 512 12 8 2 64 1408); batch=(256 2 1) ;;
  small) dims=(4096 128 4 4 2 32 352); batch=(128 16 2) ;;
  *) echo "--model is base or small, not $model" >&2; exit 2 ;;
esac
seq_len=${BENCH_SEQ_LEN:-${batch[0]}}
micro_batch=${BENCH_MICRO_BATCH:-${batch[1]}}
grad_accum=${BENCH_GRAD_ACCUM:-${batch[2]}}
if ((micro_batch % ranks == 0)); then
  rank_batch=($((micro_batch / ranks)) "$grad_accum")
elif ((grad_accum % ranks == 0)); then
  rank_batch=("$micro_batch" $((grad_accum / ranks)))
else
  echo "$ranks ranks divide neither micro_batch $micro_batch nor grad_accum $grad_accum" >&2
  exit 2
fi
tokens_per_step=$((micro_batch * grad_accum * seq_len))

work=$(mktemp -d /tmp/allreduce.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${log:-$work/allreduce.log}

# One configuration's run: ranks, threads per rank, micro_batch, grad_accum, overlap. Prints its
# figures (bench/metrics_summary.py); its output goes to the log.
run() {
  local n=$1 threads=$2 micro=$3 accum=$4 overlap=$5 run_dir=$work/run last=$((warmup + steps))
  local sets=() setting launcher=()
  rm -rf "$run_dir"
  for setting in \
    model.vocab_size="${dims[0]}" model.d_model="${dims[1]}" model.n_layers="${dims[2]}" \
    model.n_q_heads="${dims[3]}" model.n_kv_heads="${dims[4]}" model.head_dim="${dims[5]}" \
    model.d_ffn="${dims[6]}" model.max_seq_len="$seq_len" \
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" data.tokenizer="$data/tokenizer.model" \
    data.seq_len="$seq_len" data.micro_batch="$micro" data.grad_accum="$accum" \
    train.device=cpu train.precision=fp32 train.threads="$threads" dist.overlap="$overlap" \
    train.max_steps="$last" train.log_every=1 train.eval_every="$last" train.eval_batches=1 \
    train.ckpt_every="$last" train.run_dir="$run_dir" optim.warmup_steps=1; do
    sets+=(--set "$setting")
  done
  ((n > 1)) && launcher=("$mpirun" --oversubscribe --bind-to "$bind" -n "$n")
  timeout "$run_timeout" "${launcher[@]}" "$bin_dir/mltrain" "$repo/configs/base.yaml" \
    "${sets[@]}" >>"$log" 2>&1 || return
  "$python" "$repo/bench/metrics_summary.py" "$run_dir/metrics.jsonl" --warmup "$warmup"
}

# name: ranks threads micro_batch grad_accum overlap
configs=(one overlap sequential share)
declare -A spec=([one]="1 $ranks $micro_batch $grad_accum true"
  [overlap]="$ranks 1 ${rank_batch[*]} true" [sequential]="$ranks 1 ${rank_batch[*]} false"
  [share]="1 1 ${rank_batch[*]} false")
declare -A rates step_ms
echo "[allreduce] $model model, $tokens_per_step tokens per step: 1 rank x $ranks threads against" \
  "$ranks ranks x 1 thread, overlap on and off, and one rank's share alone; $steps timed steps" \
  "after $warmup, $reps repetitions; log: $log" >&2
for ((rep = 1; rep <= reps; ++rep)); do
  for config in "${configs[@]}"; do
    echo "=== $config (ranks threads micro_batch grad_accum overlap: ${spec[$config]})," \
      "repetition $rep" >>"$log"
    result=""
    # shellcheck disable=SC2086  # the spec is five words
    result=$(run ${spec[$config]}) || echo "=== $config failed" >>"$log"
    printf '%s\n' "$result" >>"$log"
    rate=$(sed -n 's/^tokens_per_s //p' <<<"$result")
    if [[ -n $rate ]]; then
      rates[$config]+="$rate "
      step_ms[$config]+="$(sed -n 's/^step_ms //p' <<<"$result") "
    fi
    echo "[allreduce] repetition $rep, $config: ${rate:-no result (see the log)} tokens/s" >&2
  done
done

"$python" - "$model" "$ranks" "$tokens_per_step" "$seq_len" "$steps" "$warmup" \
  "${spec[one]}" "${spec[overlap]}" "${spec[sequential]}" "${spec[share]}" \
  "${rates[one]:-}" "${rates[overlap]:-}" "${rates[sequential]:-}" "${rates[share]:-}" \
  "${step_ms[one]:-}" "${step_ms[overlap]:-}" "${step_ms[sequential]:-}" "${step_ms[share]:-}" \
  <<'EOF' | tee -a "$log"
import statistics, sys
model, ranks, tokens, seq_len, steps, warmup = sys.argv[1:7]
specs, rates, step_ms = sys.argv[7:11], sys.argv[11:15], sys.argv[15:19]
names = ["1 rank", f"{ranks} ranks, overlap on", f"{ranks} ranks, overlap off",
         f"1 rank of 1 thread, one rank's share, x {ranks} (no all-reduce)"]
print(f"\n### Data-parallel scaling on the CPU: {model} model, fp32\n")
print(f"{tokens} tokens per step (global batch; sequences of {seq_len}), {ranks} threads in all; "
      f"a run's figure is the median of its {steps} steps after {warmup} warm-up steps; "
      f"the all-reduce is MPI's\n")
print("| configuration | ranks x threads | micro_batch x grad_accum per rank | tokens/s, median of "
      "runs | spread, min to max | step ms | runs | of 1 rank's tokens/s |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
base = None
for i, name in enumerate(names):
    n, threads, micro, accum, _ = specs[i].split()
    shape = f"{n} x {threads}"
    # The share trains 1/ranks of the batch: ranks of it, with no all-reduce, would train the whole.
    scale = int(ranks) if i == 3 else 1
    values = [float(x) * scale for x in rates[i].split()]
    if not values:
        print(f"| {name} | {shape} | {micro} x {accum} | no result | | | 0 | |")
        continue
    median = statistics.median(values)
    if i == 0:
        base = median
    spread = (max(values) - min(values)) / median * 100
    ms = [float(x) for x in step_ms[i].split()]
    ms = f"{statistics.median(ms):,.0f}" if ms else ""
    ratio = f"{median / base:.3f}" if base else "no 1-rank result"
    print(f"| {name} | {shape} | {micro} x {accum} | {median:,.0f} | {min(values):,.0f} to "
          f"{max(values):,.0f} ({spread:.1f}%) | {ms} | {len(values)} | {ratio} |")
print(f"\nThe target: {ranks} ranks at 0.95 of one rank's tokens/s or more. The last row is a "
      f"ceiling for {ranks} ranks: what the split of the batch and of the threads leaves, before "
      f"any communication; its step time is one rank's share's.")
EOF

for config in "${configs[@]}"; do
  [[ -n ${rates[$config]:-} ]] || exit 1
done
