"""Runs the reference model on weights and a batch written by the C++ parity test.

usage: parity.py CONFIG_JSON WEIGHTS.safetensors BATCH.safetensors OUT.safetensors
BATCH holds "tokens" and "targets" [B, T] int64. OUT receives "logits", "loss" and, for every
weight, "grad.<name>".
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file

import minillama


def main(config_path, weights_path, batch_path, out_path):
    with open(config_path) as f:
        config = json.load(f)
    weights = {name: t.requires_grad_(True) for name, t in load_file(weights_path).items()}
    batch = load_file(batch_path)
    logits = minillama.forward(batch["tokens"], weights, config)
    loss = minillama.loss(logits, batch["targets"])
    loss.backward()
    out = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    out.update({"grad." + name: t.grad.contiguous() for name, t in weights.items()})
    save_file(out, out_path)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(*sys.argv[1:])
