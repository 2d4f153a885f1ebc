#!/usr/bin/env bash
# Training throughput side by side: mltrain against the same model and step in PyTorch
# (bench/reference_train.py), eager and under torch.compile, on the same device, precision,
# batch and thread count. The three run in turn, repetition after repetition, so that the
# machine's drift touches all alike; each run's figure is the median tokens/s of its steps after
# the warm-up, and the markdown table on stdout gives the median over repetitions, the spread and
# the ratios mltrain/eager and mltrain/compile, with each implementation's peak memory (the CUDA
# allocator's peak on a GPU, the process's peak RSS on the CPU) and mltrain's against
# torch.compile's. It exits 1 when a variant has no result.
#
# The table also gives each implementation's achieved FLOP/s, tokens/s x FLOPs per token by
# PaLM's formula (appendix B): 6 N + 12 n_layers n_q_heads head_dim seq_len, N every parameter
# (the tied embedding once), and that as a fraction of this machine's matrix-product rate in the
# same precision: bench/matmul_rate.py, run once first with the same device, threads and model
# shapes (the FLOP-weighted rate of a micro-batch's GEMMs). For mltrain it adds the overheads from
# its metrics.jsonl, medians over the timed steps: the loader wait, data_ms / step_ms, and the time
# outside forward, backward and the optimizer step, 1 - (data_ms + forward_backward_ms +
# optimizer_ms) / step_ms (where the rows have those keys).
#
#   bench/train_throughput.sh [--device cpu|cuda] [--model base|small|llama-1b] [--precision bf16|fp32]
#                             [--steps N] [--warmup N] [--reps N] [--log FILE]
#
# base is configs/base.yaml's model and batch (16 x 4 x 1024 tokens; on the CPU 2 x 1 x 256, by
# default), small is configs/smoke.yaml's (16 x 2 x 128), llama-1b is configs/llama-1b.yaml's model
# (untied embeddings) at 4 x 1 x 2048 tokens on one GPU (on the CPU 1 x 1 x 256). Environment:
#   BENCH_SEQ_LEN, BENCH_MICRO_BATCH, BENCH_GRAD_ACCUM  another batch than the model's default
#   BENCH_THREADS    CPU intra-op threads of every run (default: all cores)
#   BENCH_VARIANTS   which to run (default "mltrain eager compile"); "masked" is mltrain with
#                    data.document_masking, reported against mltrain as masked/mltrain; "fused" is
#                    mltrain with train.kernels=fused_cuda, its CUDA kernels on a GPU (mltrain is
#                    train.kernels=auto, the ATen layers there), reported against both; "zero3"
#                    is mltrain with dist.zero_stage=3 on its one rank, reported against mltrain
#                    (a world of one shards nothing, and must cost nothing)
#   BENCH_BUDGET_S   seconds for the whole benchmark: runs are cut off there (default: no limit)
#   BENCH_RUN_LIMIT_S  seconds for one run, so that one that hangs leaves the others their time
#                    (default: no limit but the budget)
#   BENCH_DATA       shards mltrain reads (default bench/gpu-packages/shards, else data/demo);
#                    the reference draws random tokens
#   BENCH_MATMUL_FLOPS  this precision's matrix-product rate in FLOP/s, instead of measuring it
#   BENCH_MATMUL_SOURCE  what BENCH_MATMUL_FLOPS is, for the table (e.g. a GPU's peak: the MFU)
#   BENCH_MATMUL     0: neither measure nor report the matrix-product rate (default 1)
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

# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
threads=${BENCH_THREADS:-$(nproc)}
variants=${BENCH_VARIANTS:-mltrain eager compile}
budget=${BENCH_BUDGET_S:-0}
run_limit=${BENCH_RUN_LIMIT_S:-0}
matmul_flops=${BENCH_MATMUL_FLOPS:-}
matmul=${BENCH_MATMUL:-1}

# vocab_size d_model n_layers n_q_heads n_kv_heads head_dim d_ffn; seq_len micro_batch grad_accum
tied=true
case $model in
  base) dims=(4096 512 12 8 2 64 1408); batch=(1024 16 4); [[ $device == cpu ]] && batch=(256 2 1) ;;
  small) dims=(4096 128 4 4 2 32 352); batch=(128 16 2) ;;
  llama-1b)
    dims=(32000 2048 22 32 4 64 5632) tied=false
    batch=(2048 4 1)
    [[ $device == cpu ]] && batch=(256 1 1)
    ;;
  *) echo "--model is base, small or llama-1b, not $model" >&2; exit 2 ;;
esac
seq_len=${BENCH_SEQ_LEN:-${batch[0]}}
micro_batch=${BENCH_MICRO_BATCH:-${batch[1]}}
grad_accum=${BENCH_GRAD_ACCUM:-${batch[2]}}
tokens_per_step=$((micro_batch * grad_accum * seq_len))

work=$(mktemp -d "${TMPDIR:-/tmp}/train_throughput.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=${log:-$work/throughput.log}
start_s=$SECONDS

# Runs "$@" within what is left of the budget and the run's own limit, where they are set.
bounded() {
  local limit=$run_limit
  if ((budget > 0)); then
    local left=$((budget - (SECONDS - start_s)))
    ((limit == 0 || left < limit)) && limit=$left
  fi
  if ((limit > 0)); then timeout "$limit" "$@"; else "$@"; fi
}

# Whether the budget, if there is one, still has 10 s for another run.
time_left() {
  ((budget == 0 || budget - (SECONDS - start_s) >= 10))
}

# Prints the run's figures from its metrics.jsonl (bench/metrics_summary.py): tokens_per_s, and
# loader_pct, outside_pct and peak_memory_bytes where the build logs what they need. Arguments are
# further KEY=VALUE settings.
run_mltrain() {
  local run_dir=$work/mltrain_run last=$((warmup + steps)) sets=() setting
  rm -rf "$run_dir"
  for setting in \
    model.vocab_size="${dims[0]}" model.d_model="${dims[1]}" model.n_layers="${dims[2]}" \
    model.n_q_heads="${dims[3]}" model.n_kv_heads="${dims[4]}" model.head_dim="${dims[5]}" \
    model.d_ffn="${dims[6]}" model.max_seq_len="$seq_len" model.tie_word_embeddings="$tied" \
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" data.tokenizer="$data/tokenizer.model" \
    data.seq_len="$seq_len" data.micro_batch="$micro_batch" data.grad_accum="$grad_accum" \
    train.device="$device" train.precision="$precision" train.threads="$threads" \
    train.max_steps="$last" train.log_every=1 train.eval_every="$last" train.eval_batches=1 \
    train.ckpt_every="$last" train.run_dir="$run_dir" optim.warmup_steps=1 train.tf32=false "$@"; do
    sets+=(--set "$setting")
  done
  bounded "$bin_dir/mltrain" "$repo/configs/base.yaml" "${sets[@]}" || return
  "$python" "$repo/bench/metrics_summary.py" "$run_dir/metrics.jsonl" --warmup "$warmup"
}

run_reference() {
  local flags=(--device "$device" --precision "$precision" --threads "$threads" --steps "$steps"
    --warmup "$warmup" --vocab-size "${dims[0]}" --d-model "${dims[1]}" --n-layers "${dims[2]}"
    --n-q-heads "${dims[3]}" --n-kv-heads "${dims[4]}" --head-dim "${dims[5]}" --d-ffn "${dims[6]}"
    --seq-len "$seq_len" --micro-batch "$micro_batch" --grad-accum "$grad_accum")
  [[ $1 == compile ]] && flags+=(--compile)
  [[ $tied == false ]] && flags+=(--untied)
  PYTHONUNBUFFERED=1 bounded "$python" "$repo/bench/reference_train.py" "${flags[@]}"
}

# This machine's matrix-product rate in FLOP/s at the run's precision, shapes and threads, its
# output appended to the log; prints nothing when it failed or the budget has no time for it.
measure_matmul_rate() {
  local output rc=0
  if ! time_left; then
    echo "=== bench/matmul_rate.py: not run, the ${budget} s budget is spent" >>"$log"
    return
  fi
  echo "=== bench/matmul_rate.py" >>"$log"
  output=$(bounded "$python" "$repo/bench/matmul_rate.py" --device "$device" \
    --precision "$precision" --threads "$threads" --vocab-size "${dims[0]}" \
    --d-model "${dims[1]}" --n-layers "${dims[2]}" --n-q-heads "${dims[3]}" \
    --n-kv-heads "${dims[4]}" --head-dim "${dims[5]}" --d-ffn "${dims[6]}" \
    --seq-len "$seq_len" --micro-batch "$micro_batch" 2>&1) || rc=$?
  printf '%s\n' "$output" >>"$log"
  if ((rc != 0)); then
    echo "=== bench/matmul_rate.py failed with exit code $rc" >>"$log"
    return
  fi
  sed -n "s/^${precision}_flops_per_s //p" <<<"$output" | tail -1
}

# One run, its output appended to the log; prints its tokens/s and peak memory lines (and
# mltrain's overheads), or nothing when it failed or the budget has no time left for it.
measure() {
  local variant=$1 rep=$2 output rc=0
  if ! time_left; then
    echo "=== $variant, repetition $rep: not run, the ${budget} s budget is spent" >>"$log"
    return
  fi
  echo "=== $variant, repetition $rep" >>"$log"
  case $variant in
    mltrain) output=$(run_mltrain 2>&1) || rc=$? ;;
    masked) output=$(run_mltrain data.document_masking=true 2>&1) || rc=$? ;;
    fused) output=$(run_mltrain train.kernels=fused_cuda 2>&1) || rc=$? ;;
    zero3) output=$(run_mltrain dist.zero_stage=3 2>&1) || rc=$? ;;
    eager | compile) output=$(run_reference "$variant" 2>&1) || rc=$? ;;
    *) echo "unknown variant $variant in BENCH_VARIANTS" >&2; exit 2 ;;
  esac
  printf '%s\n' "$output" >>"$log"
  if ((rc != 0)); then
    echo "=== $variant failed with exit code $rc$( ((rc == 124)) && echo ', out of time')" >>"$log"
    return
  fi
  grep -E '^(tokens_per_s|loader_pct|outside_pct|peak_memory_bytes) ' <<<"$output" || true
}

echo "[train_throughput] $model model on $device, $precision, $tokens_per_step tokens per step," \
  "$steps timed steps after $warmup, $reps repetitions; log: $log" >&2
gemm_rate="the FLOP-weighted rate of a micro-batch's GEMMs at these shapes and threads"
matmul_source="$gemm_rate (measured by bench/matmul_rate.py just before the runs)"
if [[ -n $matmul_flops ]]; then
  matmul_source=${BENCH_MATMUL_SOURCE:-$gemm_rate (given by BENCH_MATMUL_FLOPS)}
elif [[ $matmul == 0 ]]; then
  matmul_source="not measured: BENCH_MATMUL=0"
else
  matmul_flops=$(measure_matmul_rate)
  echo "[train_throughput] $precision matrix-product rate:" \
    "${matmul_flops:-no result (see the log)} FLOP/s" >&2
fi

declare -A rates
loader="" outside="" peak_memory=""  # peak_memory: variant:bytes for each run that logged it
for ((rep = 1; rep <= reps; ++rep)); do
  for variant in $variants; do
    result=$(measure "$variant" "$rep")
    rate=$(sed -n 's/^tokens_per_s //p' <<<"$result" | tail -1)
    if [[ -n $rate ]]; then
      rates[$variant]+="$rate "
      peak=$(sed -n 's/^peak_memory_bytes //p' <<<"$result" | tail -1)
      [[ -n $peak ]] && peak_memory+="$variant:$peak "
      if [[ $variant == mltrain ]]; then
        loader+="$(sed -n 's/^loader_pct //p' <<<"$result" | tail -1) "
        outside+="$(sed -n 's/^outside_pct //p' <<<"$result" | tail -1) "
      fi
    fi
    echo "[train_throughput] repetition $rep, $variant: ${rate:-no result (see the log)} tokens/s" >&2
  done
done

"$python" - "$model" "$device" "$precision" "$tokens_per_step" "$steps" "$warmup" "$threads" \
  "$variants" "${rates[mltrain]:-}" "${rates[eager]:-}" "${rates[compile]:-}" "${dims[*]}" \
  "$seq_len" "$matmul_flops" "$matmul_source" "$loader" "$outside" "$peak_memory" \
  "${rates[masked]:-}" "$tied" "${rates[fused]:-}" "${rates[zero3]:-}" \
  <<'EOF' | tee -a "$log"
import statistics, sys
model, device, precision, tokens, steps, warmup, threads, variants = sys.argv[1:9]
names = ["mltrain", "PyTorch eager", "PyTorch torch.compile", "mltrain, document masking",
         "mltrain, train.kernels=fused_cuda", "mltrain, dist.zero_stage=3 on one rank"]
variant_of = dict(zip(names, ["mltrain", "eager", "compile", "masked", "fused", "zero3"]))
runs = {name: [float(x) for x in values.split()]
        for name, values in zip(names, sys.argv[9:12] + sys.argv[19:20] + sys.argv[21:23])
        if variant_of[name] in variants.split()}
V, d, L, H, KV, D, F = (int(x) for x in sys.argv[12].split())
T = int(sys.argv[13])
matmul = float(sys.argv[14]) if sys.argv[14] else None
matmul_source = sys.argv[15]
loader, outside = ([float(x) for x in arg.split()] for arg in sys.argv[16:18])
# Each variant's largest peak over its runs.
peaks = {}
for entry in sys.argv[18].split():
    variant, peak = entry.split(":")
    peaks[variant] = max(peaks.get(variant, 0), int(peak))
tied = sys.argv[20] == "true"
# PaLM (Chowdhery et al. 2022), appendix B: 6 N + 12 L H D T per token, N every parameter (an
# untied output projection too).
N = (V * d + L * (d * H * D + 2 * d * KV * D + H * D * d + 3 * d * F + 2 * d) + d
     + (0 if tied else V * d))
dense, attention = 6 * N, 12 * L * H * D * T
flops_per_token = dense + attention

where = f"{threads} CPU threads" if device == "cpu" else f"one {device} device"
if device == "cuda" and precision == "fp32":
    where += ", TF32 off for every implementation (mltrain's train.tf32=false, PyTorch's default)"
print(f"\n### Training throughput: {model} model, {device}, {precision}\n")
print(f"{tokens} tokens per step, {where}; a run's figure is the median of its "
      f"{steps} steps after {warmup} warm-up steps\n")
memory_kind = "CUDA allocator's peak" if device == "cuda" else "peak RSS"
print(f"| implementation | tokens/s, median of runs | spread, min to max | runs "
      f"| achieved GFLOP/s | of the {precision} matmul rate | peak memory ({memory_kind}) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
medians = {}
for name, values in runs.items():
    if not values:
        print(f"| {name} | no result | | 0 | | | |")
        continue
    medians[name] = statistics.median(values)
    spread = (max(values) - min(values)) / medians[name] * 100
    achieved = medians[name] * flops_per_token
    fraction = f"{achieved / matmul * 100:.1f}%" if matmul else "not measured"
    peak = peaks.get(variant_of[name])
    memory = f"{peak / 1e9:,.2f} GB" if peak else "not logged"
    print(f"| {name} | {medians[name]:,.0f} | {min(values):,.0f} to {max(values):,.0f} "
          f"({spread:.1f}%) | {len(values)} | {achieved / 1e9:,.1f} | {fraction} | {memory} |")
ratios = [f"mltrain/{short}: {medians['mltrain'] / medians[other]:.2f}x"
          for short, other in [("eager", names[1]), ("compile", names[2])]
          if "mltrain" in medians and other in medians]
if peaks.get("mltrain") and peaks.get("compile"):
    ratios.append(f"peak memory mltrain/compile: {peaks['mltrain'] / peaks['compile']:.2f}x")
if "mltrain" in medians and names[3] in medians:
    ratios.append(f"masked/mltrain: {medians[names[3]] / medians['mltrain']:.3f}x")
if names[4] in medians:
    ratios += [f"fused/{short}: {medians[names[4]] / medians[other]:.2f}x"
               for short, other in [("mltrain", "mltrain"), ("compile", names[2])]
               if other in medians]
if peaks.get("fused") and peaks.get("compile"):
    ratios.append(f"peak memory fused/compile: {peaks['fused'] / peaks['compile']:.2f}x")
if "mltrain" in medians and names[5] in medians:
    ratios.append(f"zero3/mltrain: {medians[names[5]] / medians['mltrain']:.3f}x")
    if peaks.get("zero3") and peaks.get("mltrain"):
        ratios.append(f"peak memory zero3/mltrain: {peaks['zero3'] / peaks['mltrain']:.2f}x")
print("\n" + ("; ".join(ratios) if ratios else "no ratio: mltrain or both references have no result"))
print(f"\nFLOPs per token (PaLM, appendix B): 6 N + 12 n_layers n_q_heads head_dim seq_len = "
      f"6 x {N:,} + 12 x {L} x {H} x {D} x {T} = {flops_per_token / 1e6:,.1f} MFLOP; N is every "
      f"parameter, " + ("the tied embedding once: " if tied else "the output projection too: ")
      + "V d + n_layers (d H D + 2 d KV D + H D d + 3 d d_ffn + 2 d) + d"
      + ("" if tied else " + V d") + f", with V {V}, d {d}, H {H}, KV {KV}, D {D}, d_ffn {F}.")
if matmul:
    print(f"\nMatrix-product rate, {precision}: {matmul / 1e9:,.1f} GFLOP/s, {matmul_source}.")
else:
    reason = matmul_source if "BENCH_MATMUL=0" in matmul_source else "no result (see the log)"
    print(f"\nMatrix-product rate, {precision}: {reason}.")
if runs.get("mltrain"):
    def text(values):
        if not values:
            return "not in its metrics.jsonl"
        median = statistics.median(values)
        return "under 0.01%" if 0 <= median < 0.01 else f"{median:.2f}%"
    print(f"\nmltrain's overheads, the median over runs of the median over timed steps, in "
          f"percent of the step time: loader wait {text(loader)} (target under 1%); time outside "
          f"forward, backward and the optimizer step {text(outside)} (target under 2%)."
          + (" On a GPU these are host times: a phase ends once its work is queued, so the wait "
             "for the device counts as outside." if device == "cuda" else ""))
EOF

# A variant without a result fails the benchmark, after its table.
for variant in $variants; do
  [[ -n ${rates[$variant]:-} ]] || exit 1
done
