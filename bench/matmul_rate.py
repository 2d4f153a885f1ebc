"""This machine's matrix-product rate for one model's training GEMMs, through the same torch the
benchmarks use: the limit that bench/train_throughput.sh reports each trainer's FLOP/s against.

It times, in fp32 and/or bf16 and at a given thread count, every matrix product a training step of
the model does, each alone and with its output preallocated: per linear layer [M,K]x[K,N] the
forward X W^T, the input gradient dY W and the weight gradient dY^T X (M = tokens in a
micro-batch, K,N from d_model, the head widths, d_ffn and the vocabulary), and per attention layer
the six batched products of Q K^T and P V and their gradients, full (not causal) [T,T] scores.
Each product is warmed up, repeated until one sample lasts --min-sample-ms, and sampled up to
--reps times, the products interleaved within each repetition; its rate is FLOPs over the median
sample. The step's rate is the FLOP-weighted one: the step's GEMM FLOPs over the time they take at
those rates, M x (6 x matrix parameters + 12 x n_layers x n_q_heads x head_dim x seq_len) per
micro-batch, which is the PaLM FLOP-per-token formula bench/train_throughput.sh uses, less the
norm weights.

    python bench/matmul_rate.py --threads 2 --micro-batch 2 --seq-len 256           # base, CPU
    python bench/matmul_rate.py --device cuda --precision bf16 --markdown

Prints machine-readable lines first (`fp32_flops_per_s 4.51e+10`, `fp32_best_flops_per_s ...`),
then a human line per precision, and with --markdown a table of every product. Repetitions past
--min-reps stop once --max-seconds have passed, so that a precision takes a few seconds, or some
tens where bf16 is emulated (a CPU without AVX512-BF16 or AMX-BF16).
"""
import argparse
import math
import statistics
import time

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="both", choices=["fp32", "bf16", "both"])
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0: torch's default)")
    p.add_argument("--reps", type=int, default=5, help="samples of each product")
    p.add_argument("--min-reps", type=int, default=2, help="samples of each product at least")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls of each product first")
    p.add_argument("--min-sample-ms", type=float, default=0.0,
                   help="a sample repeats its product until it lasts this long (default 20 on the "
                        "CPU, 5 on CUDA)")
    p.add_argument("--max-seconds", type=float, default=4.0,
                   help="per precision: no repetition past --min-reps starts after this")
    p.add_argument("--markdown", action="store_true", help="also print a table of every product")
    for name, default in [("vocab-size", 4096), ("d-model", 512), ("n-layers", 12), ("n-q-heads", 8),
                          ("n-kv-heads", 2), ("head-dim", 64), ("d-ffn", 1408), ("seq-len", 1024),
                          ("micro-batch", 16)]:
        p.add_argument("--" + name, type=int, default=default)
    return p.parse_args()


class Product:
    """One matrix product of a training step: its operands, FLOPs and calls per micro-batch."""

    def __init__(self, label, shape, flops, calls, run):
        self.label, self.shape, self.flops, self.calls, self.run = label, shape, flops, calls, run
        self.inner = 1
        self.samples = []

    def median_s(self):
        return statistics.median(self.samples)

    def rate(self):
        return self.flops / self.median_s()

    def spread(self):
        """(max - min) / median of the samples: a loaded machine shows here."""
        return (max(self.samples) - min(self.samples)) / self.median_s()


def linear_products(name, m, k, n, calls, dtype, device):
    """Forward X W^T, input gradient dY W and weight gradient dY^T X of a [K -> N] linear layer
    over M tokens, laid out as autograd lays them out (W is [N, K])."""
    x = torch.randn(m, k, dtype=dtype, device=device)
    w = torch.randn(n, k, dtype=dtype, device=device)
    dy = torch.randn(m, n, dtype=dtype, device=device)
    y, dx, dw = (torch.empty(s, dtype=dtype, device=device) for s in [(m, n), (m, k), (n, k)])
    flops = 2.0 * m * k * n
    return [
        Product(f"{name} forward", f"[{m}x{k}] x [{k}x{n}]", flops, calls,
                lambda: torch.mm(x, w.t(), out=y)),
        Product(f"{name} input gradient", f"[{m}x{n}] x [{n}x{k}]", flops, calls,
                lambda: torch.mm(dy, w, out=dx)),
        Product(f"{name} weight gradient", f"[{n}x{m}] x [{m}x{k}]", flops, calls,
                lambda: torch.mm(dy.t(), x, out=dw)),
    ]


def attention_products(b, t, d, calls, dtype, device):
    """The six batched products of attention over b = micro_batch x n_q_heads heads, grouped by
    layout: Q K^T and dO V^T; P V and dS K; dS^T Q and P^T dO."""
    a = torch.randn(b, t, d, dtype=dtype, device=device)
    c = torch.randn(b, t, d, dtype=dtype, device=device)
    s = torch.randn(b, t, t, dtype=dtype, device=device) / math.sqrt(t)
    out_tt = torch.empty(b, t, t, dtype=dtype, device=device)
    out_td = torch.empty(b, t, d, dtype=dtype, device=device)
    flops = 2.0 * b * t * t * d
    return [
        Product("attention Q K^T, dO V^T", f"{b} x [{t}x{d}] x [{d}x{t}]", flops, 2 * calls,
                lambda: torch.bmm(a, c.transpose(1, 2), out=out_tt)),
        Product("attention P V, dS K", f"{b} x [{t}x{t}] x [{t}x{d}]", flops, 2 * calls,
                lambda: torch.bmm(s, c, out=out_td)),
        Product("attention dS^T Q, P^T dO", f"{b} x [{t}x{t}]^T x [{t}x{d}]", flops, 2 * calls,
                lambda: torch.bmm(s.transpose(1, 2), c, out=out_td)),
    ]


def model_products(args, dtype, device):
    m, d, L = args.micro_batch * args.seq_len, args.d_model, args.n_layers
    q, kv = args.n_q_heads * args.head_dim, args.n_kv_heads * args.head_dim
    # (name, K, N, calls per micro-batch); equal shapes are timed once and counted together. The
    # projections as mltrain runs them: q, k and v as one product, gate and up as one.
    layers = [("wqkv", d, q + 2 * kv, L), ("wo", q, d, L),
              ("w_gate_up", d, 2 * args.d_ffn, L), ("w_down", args.d_ffn, d, L),
              ("lm_head (tied)", d, args.vocab_size, 1)]
    merged = {}
    for name, k, n, calls in layers:
        if (k, n) in merged:
            old_name, old_calls = merged[(k, n)]
            merged[(k, n)] = (f"{old_name}, {name}", old_calls + calls)
        else:
            merged[(k, n)] = (name, calls)
    products = []
    for (k, n), (name, calls) in merged.items():
        products += linear_products(name, m, k, n, calls, dtype, device)
    products += attention_products(args.micro_batch * args.n_q_heads, args.seq_len, args.head_dim,
                                   L, dtype, device)
    return products


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(products, args, device):
    min_sample = (args.min_sample_ms or (20.0 if device.type == "cpu" else 5.0)) / 1e3
    for product in products:
        for _ in range(max(1, args.warmup)):  # the last warm-up call calibrates the sample
            synchronize(device)
            start = time.perf_counter()
            product.run()
            synchronize(device)
        once = max(time.perf_counter() - start, 1e-7)
        product.inner = max(1, math.ceil(min_sample / once))
    start = time.perf_counter()
    for rep in range(args.reps):
        for product in products:
            synchronize(device)
            begin = time.perf_counter()
            for _ in range(product.inner):
                product.run()
            synchronize(device)
            product.samples.append((time.perf_counter() - begin) / product.inner)
        past_time = time.perf_counter() - start > args.max_seconds
        if rep + 1 >= min(args.min_reps, args.reps) and past_time:
            break
    return time.perf_counter() - start


def main():
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    tokens = args.micro_batch * args.seq_len
    where = (f"{torch.get_num_threads()} CPU threads" if device.type == "cpu" else
             f"{torch.cuda.get_device_name(device)}, TF32 "
             f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    print(f"matmul_rate: torch {torch.__version__}, {args.device} ({where}), {tokens} tokens per "
          f"micro-batch ({args.micro_batch} x {args.seq_len})", flush=True)
    torch.manual_seed(0)
    results = {}
    for precision in precisions:
        products = model_products(args, dtypes[precision], device)
        seconds = measure(products, args, device)
        step_flops = sum(p.flops * p.calls for p in products)
        step_time = sum(p.median_s() * p.calls for p in products)
        rates = [p.rate() for p in products]
        spreads = [p.spread() for p in products]
        results[precision] = products
        print(f"{precision}_flops_per_s {step_flops / step_time:.4e}")
        print(f"{precision}_best_flops_per_s {max(rates):.4e}")
        print(f"{precision}_worst_flops_per_s {min(rates):.4e}")
        print(f"{precision}: {step_flops / step_time / 1e9:.2f} GFLOP/s over a micro-batch's GEMMs "
              f"({step_flops / 1e9:.2f} GFLOP, FLOP-weighted); best product "
              f"{max(rates) / 1e9:.2f}, worst {min(rates) / 1e9:.2f} GFLOP/s; "
              f"{len(products)} products x {len(products[0].samples)} samples in {seconds:.1f} s, "
              f"spread (max - min) / median {statistics.median(spreads) * 100:.0f}% for the median "
              f"product, {max(spreads) * 100:.0f}% at most", flush=True)
    if args.markdown:
        print(f"\n| product | shape | calls per micro-batch | "
              + " | ".join(f"{p} GFLOP/s" for p in precisions) + " |")
        print("| --- | --- | ---: | " + " | ".join("---:" for _ in precisions) + " |")
        first = results[precisions[0]]
        for i, product in enumerate(first):
            cells = " | ".join(f"{results[p][i].rate() / 1e9:.1f}" for p in precisions)
            print(f"| {product.label} | {product.shape} | {product.calls} | {cells} |")
        cells = []
        for p in precisions:
            flops = sum(x.flops * x.calls for x in results[p])
            cells.append(f"**{flops / sum(x.median_s() * x.calls for x in results[p]) / 1e9:.1f}**")
        print(f"| **a micro-batch's GEMMs, FLOP-weighted** | | | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
