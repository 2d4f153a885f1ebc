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
    # x: [B, H, T, D]; tables: [T, D], or [B, 1, T, D] for positions per row
    return x * cos + rotate_half(x) * sin


def document_layout(tokens, end_of_document):
    """Per row: each token's position in its document, and which tokens may see which.

    A document begins at each end-of-document token and at the row's first token. Token t may
    attend to token s when both lie in one document and s <= t.
    """
    b, t = tokens.shape
    positions = torch.zeros(b, t, dtype=torch.int64)
    document = torch.zeros(b, t, dtype=torch.int64)
    for row in range(b):
        for i in range(1, t):
            starts = tokens[row, i].item() == end_of_document
            document[row, i] = document[row, i - 1] + (1 if starts else 0)
            positions[row, i] = 0 if starts else positions[row, i - 1] + 1
    same = document[:, :, None] == document[:, None, :]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    return positions, (same & causal)[:, None]  # [B, T], [B, 1, T, T]


def attention(x, w, prefix, config, cos, sin, allowed):
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
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(b, t, hq * d) @ w[prefix + "o_proj.weight"].T


def feed_forward(x, w, prefix):
    gate = F.silu(x @ w[prefix + "gate_proj.weight"].T)
    up = x @ w[prefix + "up_proj.weight"].T
    return (gate * up) @ w[prefix + "down_proj.weight"].T


def forward(tokens, w, config, end_of_document=None):
    """Logits [B, T, V] of tokens [B, T] under weights w (Hugging Face names).

    With end_of_document, each row is read as the documents packed into it: positions restart at
    each document, and attention stays within it.
    """
    eps = config["norm_eps"]
    t = tokens.shape[1]
    if end_of_document is None:
        cos, sin = rope_tables(config["head_dim"], range(t), config["rope_theta"])
        allowed = torch.ones(t, t, dtype=torch.bool).tril()
    else:
        positions, allowed = document_layout(tokens, end_of_document)
        cos, sin = rope_tables(config["head_dim"], positions.flatten(), config["rope_theta"])
        cos, sin = (table.view(tokens.shape[0], 1, t, -1) for table in (cos, sin))
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(config["n_layers"]):
        p = f"model.layers.{i}."
        h = h + attention(rms_norm(h, w[p + "input_layernorm.weight"], eps), w, p + "self_attn.", config, cos, sin, allowed)
        h = h + feed_forward(rms_norm(h, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
    h = rms_norm(h, w["model.norm.weight"], eps)
    lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return h @ lm_head.T


def loss(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
