"""An independent Python implementation of the MiniLLaMA model chapter, for tests only.

Written from the spec (../shared/seed/ and DESIGN.md), not from the C++ code: explicit attention
math with repeated key/value heads instead of SDPA, Hugging Face parameter names, rotate-half RoPE.
"""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def rope_tables(head_dim, positions, theta):
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.as_tensor(positions, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    # x: [B, H, T, D]; tables: [T, D]
    return x * cos + rotate_half(x) * sin


def attention(x, w, prefix, config, cos, sin):
    b, t, _ = x.shape
    hq, hkv, d = config["n_q_heads"], config["n_kv_heads"], config["head_dim"]
    q = (x @ w[prefix + "q_proj.weight"].T).view(b, t, hq, d).transpose(1, 2)
    k = (x @ w[prefix + "k_proj.weight"].T).view(b, t, hkv, d).transpose(1, 2)
    v = (x @ w[prefix + "v_proj.weight"].T).view(b, t, hkv, d).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # Query head h reads key/value head h // (hq // hkv).
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(b, t, hq * d) @ w[prefix + "o_proj.weight"].T


def feed_forward(x, w, prefix):
    gate = F.silu(x @ w[prefix + "gate_proj.weight"].T)
    up = x @ w[prefix + "up_proj.weight"].T
    return (gate * up) @ w[prefix + "down_proj.weight"].T


def forward(tokens, w, config):
    """Logits [B, T, V] of tokens [B, T] under weights w (Hugging Face names)."""
    eps = config["norm_eps"]
    cos, sin = rope_tables(config["head_dim"], range(tokens.shape[1]), config["rope_theta"])
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(config["n_layers"]):
        p = f"model.layers.{i}."
        h = h + attention(rms_norm(h, w[p + "input_layernorm.weight"], eps), w, p + "self_attn.", config, cos, sin)
        h = h + feed_forward(rms_norm(h, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
    h = rms_norm(h, w["model.norm.weight"], eps)
    lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return h @ lm_head.T


def loss(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
