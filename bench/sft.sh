#!/usr/bin/env bash
# Fine-tuning's speed against pretraining's on the CPU (issue 45's targets: full fine-tuning at
# least 0.95x pretraining's tokens/s, a LoRA step at most 0.8x a full fine-tuning step's time): the
# base model on one rank, trained on the demo corpus (every token a target), on a chat corpus of
# the same fortunes (launch/fortune_chat.py, prepared with the demo's tokenizer and the llama2
# template: a loss mask beside each shard), and on the chat corpus with LoRA (lora.rank 8 on all
# seven projections), with the same settings otherwise, document masking on in all; the three
# runs of each round one after the other so that the machine's drift falls on all. Prints tokens/s
# per round and the ratios of the medians as a markdown table; exits 1 when a run has no result.
#
#   bench/sft.sh [--rounds R] [--steps N]
#
# Environment: BENCH_DATA (the demo corpus, default data/demo, which launch/demo.sh prepares),
# MLTRAIN_BIN_DIR and MLTRAIN_PYTHON as in bench/environment.sh.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3 steps=12
while (($# > 0)); do
  case $1 in
    --rounds) rounds=$2 ;;
    --steps) steps=$2 ;;
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
work=$(mktemp -d /tmp/sft.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$python" "$repo/launch/fortune_chat.py" >"$work/chat.jsonl"
"$bin_dir/mlprep" --input "$work/chat.jsonl" --format chat --chat-template llama2 \
  --tokenizer "$data/tokenizer.model" --out "$work/chat" >"$work/mlprep.log" 2>&1

# run CORPUS_DIR [--set ...]: tokens/s, the median over the steps after the first two.
run() {
  local corpus=$1 run_dir=$work/run
  shift
  rm -rf "$run_dir"
  "$bin_dir/mltrain" "$repo/configs/base.yaml" \
    --set data.train="$corpus/train_*.bin" --set data.val="$corpus/val_*.bin" \
    --set data.tokenizer="$corpus/tokenizer.model" --set data.document_masking=true \
    --set data.seq_len=256 --set data.micro_batch=4 --set data.grad_accum=2 \
    --set train.device=cpu --set train.precision=fp32 --set train.max_steps="$steps" \
    --set train.log_every=1 --set train.eval_every=1000000 --set train.ckpt_every=1000000 \
    --set train.run_dir="$run_dir" --set optim.warmup_steps=1 "$@" >>"$work/runs.log" 2>&1 ||
    return
  "$python" "$repo/bench/metrics_summary.py" "$run_dir/metrics.jsonl" --warmup 2 |
    awk '$1 == "tokens_per_s" { print $2 }'
}

pretrain=() sft=() lora=()
for ((round = 1; round <= rounds; ++round)); do
  pretrain+=("$(run "$data")") || true
  sft+=("$(run "$work/chat")") || true
  lora+=("$(run "$work/chat" --set lora.rank=8)") || true
  echo "[sft] round $round: pretraining ${pretrain[-1]:-no result} tokens/s," \
    "fine-tuning ${sft[-1]:-no result} tokens/s, with LoRA ${lora[-1]:-no result} tokens/s" >&2
  [[ -n ${pretrain[-1]} && -n ${sft[-1]} && -n ${lora[-1]} ]] ||
    { tail -20 "$work/runs.log" >&2; exit 1; }
done

"$python" - "${pretrain[*]}" "${sft[*]}" "${lora[*]}" <<'PY'
import statistics
import sys

pretrain, sft, lora = ([float(x) for x in arg.split()] for arg in sys.argv[1:4])
print("\n| | tokens/s per round | median |")
print("| --- | --- | ---: |")
for name, values in (("pretraining (demo corpus)", pretrain),
                     ("fine-tuning (chat corpus, loss masks)", sft),
                     ("fine-tuning with LoRA (rank 8, all projections)", lora)):
    print(f"| {name} | {', '.join(f'{v:,.0f}' for v in values)} | {statistics.median(values):,.0f} |")
print(f"\nFine-tuning over pretraining: {statistics.median(sft) / statistics.median(pretrain):.2f}x "
      "the tokens/s (target: at least 0.95x)")
print(f"A LoRA step over a full fine-tuning step: {statistics.median(sft) / statistics.median(lora):.2f}x "
      "the time (target: at most 0.8x)")
PY
