"""One mltrain run's figures from its metrics.jsonl, for the bench/ scripts: medians over the
training steps after the warm-up, one `name value` line each.

    python bench/metrics_summary.py RUN_DIR/metrics.jsonl --warmup 3

  tokens_per_s       median tokens/s (all ranks together: mltrain logs the global rate)
  step_ms            median step time
  loader_pct         median of data_ms / step_ms, in percent: the wait for the loader
  outside_pct        median of 1 - (data_ms + forward_backward_ms + optimizer_ms) / step_ms, in
                     percent: the time outside forward, backward and the optimizer step
  peak_memory_bytes  the largest peak_memory_bytes logged (rank 0: RSS on the CPU, the CUDA
                     allocator's peak on a GPU), over the training steps only

A line whose keys the rows lack (older builds log neither forward_backward_ms, optimizer_ms nor
peak_memory_bytes) is left out. Exits 1 when no training step after the warm-up was logged.
"""
import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", help="metrics.jsonl of the run")
    p.add_argument("--warmup", type=int, default=0, help="steps left out first")
    args = p.parse_args()
    with open(args.metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "tokens_per_s" in r and not r.get("skipped")]
    timed = [r for r in steps if r.get("step", 0) > args.warmup]
    if not timed:
        print(f"{args.metrics}: no training step after step {args.warmup}", file=sys.stderr)
        return 1
    print(f"tokens_per_s {statistics.median(r['tokens_per_s'] for r in timed):.1f}")
    split = [r for r in timed if r.get("step_ms", 0) > 0]
    if split:
        print(f"step_ms {statistics.median(r['step_ms'] for r in split):.3f}")
    if split and all("data_ms" in r for r in split):
        loader = statistics.median(r["data_ms"] / r["step_ms"] for r in split)
        print(f"loader_pct {loader * 100:.4f}")
        if all("forward_backward_ms" in r and "optimizer_ms" in r for r in split):
            outside = statistics.median(
                1 - (r["data_ms"] + r["forward_backward_ms"] + r["optimizer_ms"]) / r["step_ms"]
                for r in split)
            print(f"outside_pct {outside * 100:.4f}")
    peaks = [r["peak_memory_bytes"] for r in steps if "peak_memory_bytes" in r]
    if peaks:
        print(f"peak_memory_bytes {max(peaks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
