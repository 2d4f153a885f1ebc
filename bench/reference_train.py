"""The PyTorch side of bench/train_throughput.sh: MiniLLaMA trained in eager PyTorch (or under
torch.compile), for comparing mltrain's training throughput against.

Written from the model chapter (../shared/seed/) and DESIGN.md, not from the C++ code: RMSNorm
computed in fp32, rotate-half RoPE, grouped-query attention through F.scaled_dot_product_attention
with the chapter's repeated key/value heads, SwiGLU, no biases, tied embeddings (or, with
--untied, an output projection of its own, as configs/llama-1b.yaml has). A step is
mltrain's: grad_accum micro-batches of next-token cross-entropy (fp32 loss, bf16 autocast or
fp32), global-norm clipping, fused AdamW with weight decay on matrices, and the loss read back.
Every step draws a fresh random batch: a repeated batch is memorised, its gradients turn
denormal and the CPU slows down threefold. Prints the median tokens/s of the timed steps, and the
peak memory: the CUDA allocator's peak on a GPU, the process's peak RSS on the CPU (as mltrain
logs its own).
"""
import argparse
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim, length, theta):
    """cos and sin [length, head_dim], each frequency twice: pairs are (i, i + head_dim / 2)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x, cos, sin):
    # x [B, T, H, D], tables [T, D]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return x * cos.type_as(x) + rotate_half(x) * sin.type_as(x)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_q_heads, self.n_kv_heads, self.head_dim = c.n_q_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.d_model, c.n_q_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_q_heads * c.head_dim, c.d_model, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = apply_rotary(self.wq(x).view(b, t, self.n_q_heads, self.head_dim), cos, sin)
        k = apply_rotary(self.wk(x).view(b, t, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        # Query head h reads key/value head h // group, as the chapter's repeat_kv arranges.
        group = self.n_q_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w_gate = nn.Linear(c.d_model, c.d_ffn, bias=False)
        self.w_up = nn.Linear(c.d_model, c.d_ffn, bias=False)
        self.w_down = nn.Linear(c.d_ffn, c.d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.attn = Attention(c)
        self.ffn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.ffn = FeedForward(c)

    def forward(self, x, cos, sin):
        h = x + self.attn(self.attn_norm(x), cos, sin)
        return h + self.ffn(self.ffn_norm(h))


class MiniLlama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.token_embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if not c.untied:
            self.lm_head.weight = self.token_embeddings.weight
        cos, sin = rotary_tables(c.head_dim, c.seq_len, c.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2's scaling of the projections that write into the residual stream.
                residual = name.endswith(("wo.weight", "w_down.weight"))
                nn.init.normal_(p, 0.0, c.init_std / math.sqrt(2 * c.n_layers) if residual else c.init_std)

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.token_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos[:t], self.sin[:t])
        return self.lm_head(self.norm(h))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["bf16", "fp32"])
    p.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    p.add_argument("--seed", type=int, default=1337)
    for name, default in [("vocab-size", 4096), ("d-model", 512), ("n-layers", 12), ("n-q-heads", 8),
                          ("n-kv-heads", 2), ("head-dim", 64), ("d-ffn", 1408), ("seq-len", 1024),
                          ("micro-batch", 16), ("grad-accum", 4)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--untied", action="store_true", help="an output projection of its own")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--norm-eps", type=float, default=1e-6)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    return p.parse_args()


def make_optimizer(model, args):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def train_step(model, optimizer, args, device):
    loss_sum = torch.zeros((), device=device)
    for _ in range(args.grad_accum):
        window = torch.randint(args.vocab_size, (args.micro_batch, args.seq_len + 1), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten()) / args.grad_accum
        loss.backward()
        loss_sum += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum.item()  # mltrain reads its loss back every step too


def main():
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = MiniLlama(args).to(device)
    optimizer = make_optimizer(model, args)
    runnable = torch.compile(model) if args.compile else model
    tokens_per_step = args.micro_batch * args.grad_accum * args.seq_len
    n_params = sum(p.numel() for p in model.parameters())
    mode = "torch.compile" if args.compile else "eager"
    print(f"reference: {n_params} parameters on {args.device} ({torch.get_num_threads()} threads), "
          f"{args.precision}, {mode}, torch {torch.__version__}, {tokens_per_step} tokens per step",
          flush=True)

    seconds = []
    for step in range(1, args.warmup + args.steps + 1):
        start = time.perf_counter()
        loss = train_step(runnable, optimizer, args, device)
        elapsed = time.perf_counter() - start
        if step > args.warmup:
            seconds.append(elapsed)
        print(f"step {step} | loss {loss:.4f} | {elapsed * 1e3:.0f} ms | "
              f"{tokens_per_step / elapsed:.0f} tok/s", flush=True)
    median = statistics.median(seconds)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(f"median of {len(seconds)} timed steps: {median * 1e3:.1f} ms, "
          f"peak memory {peak / 1e9:.2f} GB")
    print(f"tokens_per_s {tokens_per_step / median:.1f}")
    print(f"peak_memory_bytes {peak}")


if __name__ == "__main__":
    main()
