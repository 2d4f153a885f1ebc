#!/usr/bin/env bash
# Peak memory per rank of mltrain training the base model, with its own kernels and the chunked
# loss (train.kernels=fused, as the default auto on the CPU: the loss goes through the output
# projection in chunks, so a step never holds the full [B, T, V] fp32 logits) against the plain
# ATen layers (train.kernels=aten, full logits), at each of a few batches: the peak and the drop,
# in a markdown table on stdout. It exits 1 when a run has no result.
#
#   bench/memory.sh [--device cpu|cuda] [--model base|small] [--ranks R] [--steps N] [--log FILE]
#
# Two figures per run:
#   - mltrain's own, peak_memory_bytes in its metrics.jsonl (rank 0, over the training steps): on
#     the CPU the process's peak RSS since training began (VmHWM, reset then), on a GPU the CUDA
#     allocator's peak;
#   - each rank's peak RSS as the system saw it, over the whole process, that is also the final
#     evaluation and checkpoint: from GNU time -v where it is installed, else VmHWM in
#     /proc/PID/status, polled every 0.05 s, which can miss a peak in the last instants (on a GPU,
#     host memory only).
# The drop is taken from the first where the build logs it, else from the second.
#
# Environment:
#   BENCH_MEMORY_BATCHES  micro_batch x seq_len per rank, grad_accum 1 (default "2x256 8x256" on the
#                         CPU, "16x1024" on a GPU; base's seq_len is at most 1024)
#   BENCH_MEMORY_KERNELS  the train.kernels values compared (default "fused aten")
#   BENCH_THREADS         CPU intra-op threads per rank (default all cores over the ranks)
#   BENCH_DATA            shards mltrain reads (default bench/gpu-packages/shards, else data/demo)
#   BENCH_RUN_TIMEOUT_S   seconds one run may take before it counts as failed (default 900)
#   BENCH_MPIRUN          the mpirun for more than one rank (default mpirun, --bind-to none)
#   BENCH_GNU_TIME        GNU time, for the peak RSS (default /usr/bin/time; empty: poll /proc)
#   MLTRAIN_BIN_DIR       where mltrain is (default build/bin)
#   MLTRAIN_PYTHON        the Python that reads the metrics (default the project's venv, else python3)
set -euo pipefail

# Internal: bench/memory.sh --peak-of PREFIX COMMAND... runs COMMAND (one rank) and writes its
# peak RSS in KiB to PREFIX.RANK.
if [[ ${1:-} == --peak-of ]]; then
  out=$2.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
  shift 2
  rc=0 gnu_time=${BENCH_GNU_TIME-/usr/bin/time}
  if [[ -n $gnu_time && -x $gnu_time ]]; then
    "$gnu_time" -v -o "$out.time" "$@" || rc=$?
    sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): *//p' "$out.time" >"$out"
    exit "$rc"
  fi
  "$@" &
  pid=$! peak=""
  while kill -0 "$pid" 2>/dev/null; do
    hwm=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n $hwm ]] && peak=$hwm
    sleep 0.05
  done
  wait "$pid" || rc=$?
  echo "$peak" >"$out"
  exit "$rc"
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=cpu model=base ranks=1 steps=3 log=""
while (($# > 0)); do
  case $1 in
    --device) device=$2 ;;
    --model) model=$2 ;;
    --ranks) ranks=$2 ;;
    --steps) steps=$2 ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
default_batches="2x256 8x256"
[[ $device == cuda ]] && default_batches="16x1024"
batches=${BENCH_MEMORY_BATCHES:-$default_batches}
kernels=${BENCH_MEMORY_KERNELS:-fused aten}
threads=${BENCH_THREADS:-$(($(nproc) / ranks > 0 ? $(nproc) / ranks : 1))}
run_timeout=${BENCH_RUN_TIMEOUT_S:-900}
mpirun=${BENCH_MPIRUN:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# vocab_size d_model n_layers n_q_heads n_kv_heads head_dim d_ffn max_seq_len
case $model in
  base) dims=(4096 512 12 8 2 64 1408 1024) ;;
  small) dims=(4096 128 4 4 2 32 352 256) ;;
  *) echo "--model is base or small, not $model" >&2; exit 2 ;;
esac

work=$(mktemp -d /tmp/memory.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${log:-$work/memory.log}

# One run: micro_batch seq_len kernels. Prints "peak_memory_bytes B" (mltrain's, where it logs
# it) and "rss_kib RANK KIB" per rank; its output goes to the log.
run() {
  local micro=$1 seq=$2 kernel=$3 run_dir=$work/run sets=() setting launcher=() rank
  rm -rf "$run_dir" "$work"/peak.*
  for setting in \
    model.vocab_size="${dims[0]}" model.d_model="${dims[1]}" model.n_layers="${dims[2]}" \
    model.n_q_heads="${dims[3]}" model.n_kv_heads="${dims[4]}" model.head_dim="${dims[5]}" \
    model.d_ffn="${dims[6]}" model.max_seq_len="${dims[7]}" \
    data.train="$data/train_*.bin" data.val="$data/val_*.bin" data.tokenizer="$data/tokenizer.model" \
    data.seq_len="$seq" data.micro_batch="$micro" data.grad_accum=1 \
    train.device="$device" train.precision="$([[ $device == cuda ]] && echo bf16 || echo fp32)" \
    train.threads="$threads" train.kernels="$kernel" \
    train.max_steps="$steps" train.log_every=1 train.eval_every="$steps" train.eval_batches=1 \
    train.ckpt_every="$steps" train.run_dir="$run_dir" optim.warmup_steps=1; do
    sets+=(--set "$setting")
  done
  ((ranks > 1)) && launcher=("$mpirun" --oversubscribe --bind-to none -n "$ranks")
  timeout "$run_timeout" "${launcher[@]}" bash "$repo/bench/memory.sh" --peak-of "$work/peak" \
    "$bin_dir/mltrain" "$repo/configs/base.yaml" "${sets[@]}" >>"$log" 2>&1 || return
  "$python" "$repo/bench/metrics_summary.py" "$run_dir/metrics.jsonl" |
    grep '^peak_memory_bytes ' || true
  for ((rank = 0; rank < ranks; ++rank)); do
    [[ -s $work/peak.$rank ]] && echo "rss_kib $rank $(cat "$work/peak.$rank")"
  done
  return 0
}

results=$work/results.txt
: >"$results"
failed=0
echo "[memory] $model model on $device, $ranks rank(s) of $threads thread(s), $steps steps;" \
  "batches $batches; train.kernels $kernels; log: $log" >&2
for batch in $batches; do
  micro=${batch%x*} seq=${batch#*x}
  for kernel in $kernels; do
    echo "=== micro_batch $micro, seq_len $seq, train.kernels=$kernel" >>"$log"
    result=""
    result=$(run "$micro" "$seq" "$kernel") || { echo "=== failed" >>"$log"; failed=1; }
    printf '%s\n' "$result" >>"$log"
    [[ -z $result ]] && failed=1
    sed "s/^/$micro $seq $kernel /" <<<"$result" >>"$results"
    echo "[memory] ${micro}x$seq, train.kernels=$kernel:" \
      "$(tr '\n' ' ' <<<"${result:-no result (see the log)}")" >&2
  done
done

"$python" - "$model" "$device" "$ranks" "$threads" "$steps" "${dims[0]}" "$kernels" "$batches" \
  "$results" <<'EOF' | tee -a "$log"
import sys
model, device, ranks, threads, steps, vocab, kernels, batches, results = sys.argv[1:10]
kernels, batches = kernels.split(), batches.split()
own, rss = {}, {}
for line in open(results):
    words = line.split()
    if len(words) < 5:
        continue
    key = (words[0], words[1], words[2])
    if words[3] == "peak_memory_bytes":
        own[key] = int(words[4]) / 2**20
    elif words[3] == "rss_kib" and len(words) == 6 and words[5].isdigit():
        rss.setdefault(key, {})[int(words[4])] = int(words[5]) / 1024
own_name = "RSS" if device == "cpu" else "CUDA allocator's peak"
print(f"\n### Peak memory per rank: {model} model, {device}, "
      f"{'fp32' if device == 'cpu' else 'bf16'}\n")
print(f"{ranks} rank(s) of {threads} thread(s), grad_accum 1, {steps} steps; MiB (2^20 bytes)\n")
print(f"| micro_batch x seq_len | full fp32 logits [B,T,V] | train.kernels | mltrain's peak "
      f"({own_name}, rank 0, training steps) | process peak RSS, max over ranks (whole run) |")
print("| --- | ---: | --- | ---: | ---: |")
drops = []
for batch in batches:
    micro, seq = batch.split("x")
    logits = int(micro) * int(seq) * int(vocab) * 4 / 2**20
    for kernel in kernels:
        key = (micro, seq, kernel)
        a = f"{own[key]:,.0f}" if key in own else "not logged"
        per_rank = rss.get(key, {})
        b = f"{max(per_rank.values()):,.0f}" if per_rank else "not measured"
        if len(per_rank) > 1:
            b += " (" + ", ".join(f"{per_rank[r]:,.0f}" for r in sorted(per_rank)) + ")"
        print(f"| {micro} x {seq} | {logits:,.1f} | {kernel} | {a} | {b} |")
    if "fused" in kernels and "aten" in kernels:
        figures = [(own, "mltrain's peak"), ({k: max(v.values()) for k, v in rss.items() if v},
                                               "process peak RSS")]
        for table, name in figures:
            f, a = table.get((micro, seq, "fused")), table.get((micro, seq, "aten"))
            if f is not None and a is not None:
                drop = a - f if abs(a - f) >= 0.5 else 0.0  # no "-0 MiB"
                drops.append(f"at {micro} x {seq}, {drop:,.0f} MiB ({drop / a * 100:.1f}%: "
                             f"aten {a:,.0f}, fused {f:,.0f}, {name})")
                break
if drops:
    print("\nThe drop from train.kernels=aten to fused: " + "; ".join(drops) + ".")
elif "fused" in kernels and "aten" in kernels:
    print("\nThe drop: no pair of results (see the log).")
EOF

exit "$failed"
