"""A reference training loop for the golden loss trace (tests only): the MiniLLaMA of minillama.py
trained by torch.optim.AdamW, or with optim "name" "muon" by muon.py's Muon for the blocks'
matrices and AdamW for the rest, with the warmup, cosine schedule and clipping written from their
definitions in README.md, not from the C++ code.

usage: train_reference.py CONFIG_JSON WEIGHTS.safetensors BATCHES.safetensors OUT.safetensors [FAULT]
CONFIG holds "model" (as parity.py reads it) and "optim" (lr, min_lr, warmup_steps, max_steps,
beta1, beta2, eps, weight_decay, grad_clip; for Muon name, muon_lr, muon_momentum, muon_ns_steps). BATCHES holds "batches" [steps, grad_accum, B, T+1]
int64: the windows of each micro-step, and, for a corpus with loss masks, "targets" [steps,
grad_accum, B, T] uint8: 1 where a target counts. OUT receives "losses" [steps] (float64, each
step's mean over its micro-steps; with targets, the step's loss as transformers' LlamaForCausalLM
takes it with labels -100 where a target does not count, summed over the step's targets and
divided by their count) and the weights after the last step. FAULT, for the test that the
comparison can fail: "decay-norms" (weight decay on the norms too), "shifted-schedule" (the
learning rate of the next step), "no-nesterov" (Muon steps along its momentum) or "mean-of-means"
(with targets, each micro-step's mean over its own targets, averaged over the micro-steps).
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file, save_file

import minillama
from muon import Muon


def learning_rate(optim, step):
    """Step counted from 1: linear warmup to lr, then a cosine to min_lr over the steps after it."""
    warmup = optim["warmup_steps"]
    if step <= warmup:
        return optim["lr"] * step / warmup
    progress = (step - 1 - warmup) / max(1, optim["max_steps"] - warmup)
    progress = min(max(progress, 0.0), 1.0)
    return optim["min_lr"] + (optim["lr"] - optim["min_lr"]) * 0.5 * (1 + math.cos(math.pi * progress))


def main(config_path, weights_path, batches_path, out_path, fault=""):
    with open(config_path) as f:
        config = json.load(f)
    optim = config["optim"]
    weights = {name: t.requires_grad_(True) for name, t in load_file(weights_path).items()}
    # Muon takes the matrices inside the blocks; the embedding and the norms stay on AdamW.
    use_muon = optim.get("name") == "muon"
    muon_matrices = [t for name, t in weights.items()
                     if use_muon and t.dim() == 2 and name.startswith("model.layers.")]
    adamw_weights = [t for t in weights.values() if all(t is not m for m in muon_matrices)]
    # Weight decay on matrices only: the norms' gains are not decayed.
    decayed = [t for t in adamw_weights if t.dim() >= 2 or fault == "decay-norms"]
    kept = [t for t in adamw_weights if not (t.dim() >= 2 or fault == "decay-norms")]
    optimizers = [torch.optim.AdamW(
        [{"params": decayed, "weight_decay": optim["weight_decay"]},
         {"params": kept, "weight_decay": 0.0}],
        lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]), eps=optim["eps"], foreach=False)]
    # Muon's peak learning rate: muon_lr, or lr where it is 0.
    muon_lr = optim.get("muon_lr") or optim["lr"]
    if use_muon:
        optimizers.append(Muon(muon_matrices, muon_lr, optim["muon_momentum"],
                               optim["muon_ns_steps"], optim["weight_decay"], fault))
    shift = 1 if fault == "shifted-schedule" else 0
    losses = []
    batches = load_file(batches_path)
    for step, micro_batches in enumerate(batches["batches"], start=1):
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        step_targets = batches["targets"][step - 1] if "targets" in batches else None
        for micro, window in enumerate(micro_batches):
            logits = minillama.forward(window[:, :-1], weights, config["model"])
            if step_targets is None:
                loss = minillama.loss(logits, window[:, 1:]) / len(micro_batches)
            else:
                labels = window[:, 1:].masked_fill(step_targets[micro] == 0, -100)
                summed = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                    reduction="sum")
                if fault == "mean-of-means":
                    loss = summed / step_targets[micro].sum() / len(micro_batches)
                else:
                    loss = summed / step_targets.sum()
            loss.backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), optim["grad_clip"])
        # Muon's learning rate follows the same schedule, scaled to its own peak.
        lr = learning_rate(optim, step + shift)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr if optimizer is optimizers[0] else lr * muon_lr / optim["lr"]
            optimizer.step()
        losses.append(step_loss)
    out = {"losses": torch.tensor(losses, dtype=torch.float64)}
    out.update({name: t.detach().contiguous() for name, t in weights.items()})
    save_file(out, out_path)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(*sys.argv[1:])
