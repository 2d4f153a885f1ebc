"""Runs the reference model on weights and a batch written by the C++ parity test.

usage: parity.py CONFIG_JSON WEIGHTS.safetensors BATCH.safetensors OUT.safetensors
BATCH holds "tokens" and "targets" [B, T] int64, and may hold "end_of_document" [1] int64: then each
row is read as the documents packed into it, and OUT also receives "logits_alone", each document's
logits computed by itself. OUT receives "logits", "loss" and, for every weight, "grad.<name>".
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file

import minillama


def documents_alone(tokens, weights, config, end):
    """Logits [B, T, V] of each row's documents, each computed by itself."""
    rows = []
    with torch.no_grad():
        for row in tokens:
            starts = [0] + [i for i in range(1, len(row)) if row[i].item() == end] + [len(row)]
            pieces = [minillama.forward(row[a:b].unsqueeze(0), weights, config)[0]
                      for a, b in zip(starts, starts[1:])]
            rows.append(torch.cat(pieces))
    return torch.stack(rows).contiguous()


def main(config_path, weights_path, batch_path, out_path):
    with open(config_path) as f:
        config = json.load(f)
    weights = {name: t.requires_grad_(True) for name, t in load_file(weights_path).items()}
    batch = load_file(batch_path)
    end = batch["end_of_document"].item() if "end_of_document" in batch else None
    logits = minillama.forward(batch["tokens"], weights, config, end)
    loss = minillama.loss(logits, batch["targets"])
    loss.backward()
    out = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    if end is not None:
        out["logits_alone"] = documents_alone(batch["tokens"], weights, config, end)
    out.update({"grad." + name: t.grad.contiguous() for name, t in weights.items()})
    save_file(out, out_path)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(*sys.argv[1:])
