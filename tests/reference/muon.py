"""Muon as README.md states it, for tests only: written from that statement, not from the C++ code.

usage: muon.py IN.safetensors OUT.safetensors
IN holds "weight", "grad" and "momentum" (one matrix each, float32) and "settings" [lr, momentum,
ns_steps, weight_decay] (float64). OUT receives "orthogonal" (newton_schulz of the grad) and the
"weight" and "momentum" after one Muon step.
"""
import math
import sys

import torch
from safetensors.torch import load_file, save_file

COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(matrix, steps):
    """The quintic Newton-Schulz iteration towards the nearest semi-orthogonal matrix."""
    a, b, c = COEFFICIENTS
    tall = matrix.shape[0] > matrix.shape[1]
    x = matrix.T if tall else matrix
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Nesterov momentum, orthogonalised, scaled to AdamW's update RMS, with decoupled decay.
    fault "no-nesterov" steps along the momentum itself, for the test that a trace can fail."""

    def __init__(self, params, lr, momentum, ns_steps, weight_decay, fault=""):
        super().__init__(params, dict(lr=lr, momentum=momentum, ns_steps=ns_steps,
                                      weight_decay=weight_decay))
        self.fault = fault

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            mu = group["momentum"]
            for p in group["params"]:
                buffer = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buffer.mul_(mu).add_(p.grad)
                update = buffer if self.fault == "no-nesterov" else p.grad + mu * buffer
                orthogonal = newton_schulz(update, group["ns_steps"])
                scale = 0.2 * math.sqrt(max(p.shape))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(orthogonal, alpha=-group["lr"] * scale)


def main(in_path, out_path):
    tensors = load_file(in_path)
    lr, momentum, ns_steps, weight_decay = tensors["settings"].tolist()
    weight = tensors["weight"].clone()
    weight.grad = tensors["grad"]
    optimizer = Muon([weight], lr, momentum, int(ns_steps), weight_decay)
    optimizer.state[weight]["momentum"] = tensors["momentum"].clone()
    orthogonal = newton_schulz(tensors["grad"], int(ns_steps))
    optimizer.step()
    save_file({"orthogonal": orthogonal.contiguous(), "weight": weight.contiguous(),
               "momentum": optimizer.state[weight]["momentum"].contiguous()}, out_path)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(*sys.argv[1:])
