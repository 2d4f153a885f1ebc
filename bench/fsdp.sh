#!/usr/bin/env bash
# The ZeRO stages side by side on the CPU (issue 44's targets), the stages of each round run one
# after the other so that the machine's drift falls on all of them, as ratios to stage 1, in a
# markdown table on stdout:
#   - speed: the base model on 2 ranks of 1 thread, micro-batch 4 of 256 tokens, grad_accum 2:
#     tokens/s, the median over the steps after the first two, at dist.zero_stage 0, 1, 2 and 3;
#   - memory: a model of about 200M parameters (d_model 1024, 16 layers, a 4,096-token
#     vocabulary), micro-batch 1 of 256 tokens, on 4 ranks, where the model's state dominates the
#     activations: rank 0's peak of the CPU allocator's bytes over the training steps
#     (train.cpu_memory allocator: mltrain's peak_memory_bytes counts the tensors' blocks, as the
#     memory plan does, from what the rank holds when training begins; not the resident set, which
#     adds the libraries and whatever glibc keeps of the blocks stage 3 frees every micro-step);
#     and the same with activation checkpointing, where the state dominates further (the
#     activations, the same at every stage, are a quarter of stage 3's peak without it).
# It exits 1 when a run has no result.
#
#   bench/fsdp.sh [--rounds R] [--steps N] [--benches "speed memory"] [--log FILE]
#
# Environment:
#   BENCH_DATA           shards mltrain reads (default bench/gpu-packages/shards, else data/demo,
#                        which launch/demo.sh prepares)
#   BENCH_RUN_TIMEOUT_S  seconds one run may take before it counts as failed (default 900)
#   BENCH_MPIRUN         the mpirun, one path (default mpirun; --oversubscribe --bind-to none)
#   MLTRAIN_BIN_DIR, MLTRAIN_PYTHON as in bench/environment.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=2 steps=12 benches="speed memory" log=""
while (($# > 0)); do
  case $1 in
    --rounds) rounds=$2 ;;
    --steps) steps=$2 ;;
    --benches)
      benches=$2
      for bench in $benches; do
        [[ $bench == speed || $bench == memory ]] ||
          { echo "--benches takes speed and memory, not $bench" >&2; exit 2; }
      done
      ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
if [[ ! -f $data/tokenizer.model ]]; then
  echo "no shards in $data: run launch/demo.sh (it prepares data/demo) or set BENCH_DATA" >&2
  exit 2
fi
run_timeout=${BENCH_RUN_TIMEOUT_S:-900}
mpirun=${BENCH_MPIRUN:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/fsdp.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${log:-$work/fsdp.log}

# One run: ranks stage steps warmup, then --set assignments. Prints mltrain's medians
# (bench/metrics_summary.py); its output goes to the log.
run() {
  local ranks=$1 stage=$2 run_steps=$3 warmup=$4 run_dir=$work/run sets=() setting
  shift 4
  rm -rf "$run_dir"
  for setting in \
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" data.tokenizer="$data/tokenizer.model" \
    train.device=cpu train.precision=fp32 train.threads=1 dist.zero_stage="$stage" \
    train.max_steps="$run_steps" train.log_every=1 train.eval_every=1000000 \
    train.ckpt_every=1000000 train.run_dir="$run_dir" optim.warmup_steps=1 "$@"; do
    sets+=(--set "$setting")
  done
  timeout "$run_timeout" "$mpirun" --oversubscribe --bind-to none -n "$ranks" \
    "$bin_dir/mltrain" "$repo/configs/base.yaml" "${sets[@]}" >>"$log" 2>&1 || return
  "$python" "$repo/bench/metrics_summary.py" "$run_dir/metrics.jsonl" --warmup "$warmup"
}

memory_model=(model.vocab_size=4096 model.d_model=1024 model.n_layers=16 model.n_q_heads=16
              model.n_kv_heads=4 model.head_dim=64 model.d_ffn=2816 model.max_seq_len=256
              data.seq_len=256 data.micro_batch=1 data.grad_accum=1)
speed_batch=(data.seq_len=256 data.micro_batch=4 data.grad_accum=2)

# record BENCH STAGE RESULT: the run's result into the results and the log, and a line to the user.
record() {
  printf '%s\n' "$3" >>"$log"
  if [[ -z $3 ]]; then
    echo "=== failed" >>"$log"
    failed=1
  fi
  sed "s/^/$1 $2 /" <<<"$3" >>"$results"
  echo "[fsdp] round $round, $1, stage $2: $(tr '\n' ' ' <<<"${3:-no result}")" >&2
}

results=$work/results.txt
: >"$results"
failed=0
echo "[fsdp] $rounds round(s); speed: base model, 2 ranks, $steps steps; memory: ~200M" \
  "parameters, 4 ranks, 3 steps; log: $log" >&2
for ((round = 1; round <= rounds; ++round)); do
  for stage in 0 1 2 3; do
    for bench in $benches; do
      echo "=== round $round, $bench, dist.zero_stage $stage" >>"$log"
      if [[ $bench == speed ]]; then
        result=$(run 2 "$stage" "$steps" 2 "${speed_batch[@]}") || result=""
        record "$bench" "$stage" "$result"
      else
        for recompute in false true; do
          result=$(run 4 "$stage" 3 0 "${memory_model[@]}" train.cpu_memory=allocator \
            train.activation_checkpointing=$recompute) || result=""
          record "$bench$([[ $recompute == true ]] && echo _recompute)" "$stage" "$result"
        done
      fi
    done
  done
done

"$python" - "$results" <<'EOF' | tee -a "$log"
import statistics
import sys

speed, memory = {}, {"memory": {}, "memory_recompute": {}}
for line in open(sys.argv[1]):
    words = line.split()
    if len(words) != 4:
        continue
    bench, stage, name, value = words[0], int(words[1]), words[2], float(words[3])
    if bench == "speed" and name == "tokens_per_s":
        speed.setdefault(stage, []).append(value)
    if bench in memory and name == "peak_memory_bytes":
        memory[bench].setdefault(stage, []).append(value)

def ratio(table, stage, combine):
    if stage not in table or 1 not in table:
        return "no result"
    return f"{combine(table[stage]) / combine(table[1]):.2f}x"

def mib(table, stage):
    return f"{max(table[stage]) / 2**20:,.0f}" if stage in table else "no result"

print("\n### ZeRO stages on the CPU, as ratios to stage 1\n")
print("| dist.zero_stage | tokens/s, base, 2 ranks (median of rounds) | ratio | rank 0's peak "
      "of the CPU allocator in training, ~200M parameters, 4 ranks (MiB, most of rounds) "
      "| ratio | the same with activation checkpointing | ratio |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for stage in range(4):
    s = f"{statistics.median(speed[stage]):,.0f}" if stage in speed else "no result"
    plain, recompute = memory["memory"], memory["memory_recompute"]
    print(f"| {stage} | {s} | {ratio(speed, stage, statistics.median)} | {mib(plain, stage)} | "
          f"{ratio(plain, stage, max)} | {mib(recompute, stage)} | {ratio(recompute, stage, max)} |")
print("\nTargets (issue 44): stage 3 tokens/s at least 0.9x stage 1's; stage 3 peak memory at "
      "most 0.5x stage 1's.")
EOF

exit "$failed"
