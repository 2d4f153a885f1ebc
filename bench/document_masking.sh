#!/usr/bin/env bash
# What data.document_masking costs: mltrain's training throughput with attention within documents
# against attention over whole windows, on the small and the base model, each pair run in turn
# repetition after repetition (bench/train_throughput.sh with BENCH_VARIANTS="mltrain masked"), so
# that the machine's drift touches both alike. Prints each model's table with the ratio
# masked/mltrain; the goal is at least 0.95 (at most 5% slower). The data is train_throughput.sh's
# (bench/gpu-packages/shards where that exists, else data/demo: fortunes, 77 tokens a document on
# average), whose end-of-document token its tokenizer gives.
#
#   bench/document_masking.sh [--device cpu|cuda] [--precision fp32|bf16] [--steps N] [--reps N]
#
# The small model trains on 16 x 2 windows of 128 tokens; the base model on the CPU on 2 x 1
# windows of 1024 (its full window, where attention weighs most), on CUDA on its own batch.
# BENCH_THREADS, BENCH_DATA, MLTRAIN_BIN_DIR and MLTRAIN_PYTHON are as for train_throughput.sh.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=cpu precision=fp32 steps=6 reps=3
while (($# > 0)); do
  case $1 in
    --device) device=$2 ;;
    --precision) precision=$2 ;;
    --steps) steps=$2 ;;
    --reps) reps=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

throughput() {
  BENCH_VARIANTS="mltrain masked" BENCH_MATMUL=0 bash "$repo/bench/train_throughput.sh" \
    --device "$device" --precision "$precision" --steps "$steps" --warmup 2 --reps "$reps" "$@"
}

throughput --model small
if [[ $device == cpu ]]; then
  BENCH_SEQ_LEN=1024 BENCH_MICRO_BATCH=2 BENCH_GRAD_ACCUM=1 throughput --model base
else
  throughput --model base
fi
