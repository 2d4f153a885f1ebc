"""The PyTorch side of bench/time_to_loss.sh: MiniLLaMA (bench/reference_train.py's model, written
from the chapter, not from the C++ code) trained in eager PyTorch with AdamW on the same token shards,
recipe and validation windows as mltrain, writing a metrics.jsonl as mltrain's run directory has.

The data is read from the shards as DESIGN.md defines them (a header of 256 int32: magic, version,
token count; then uint16 or uint32 tokens), as windows of seq_len + 1 tokens at stride seq_len that
never cross a shard's end. Training draws them in a seeded permutation per epoch of its own (not
mltrain's): the same tokens, another order. Validation reads the first eval_batches x micro_batch
windows of the validation shards in file order, as mltrain does on one rank, and averages the loss
over their tokens. The schedule is README.md's: linear warmup, then a cosine to min_lr. On the device
of train.device (cuda, or the CPU), under bf16 autocast where train.precision is bf16 (the loss in
fp32), as mltrain runs.

usage: time_to_loss_reference.py --config RUN.yaml --out DIR [--threads N]
RUN.yaml is the run's config as `mltrain CONFIG --set ... --dump-config` prints it: the model, data,
optim and train keys are read from it.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_train import MiniLlama  # noqa: E402

TOKEN_TYPES = {20240520: torch.uint16, 20240801: torch.uint32}


def windows_of(pattern, seq_len):
    """Every window of the sorted shards matching `pattern`: a list of int64 tensors. Torch alone
    reads them (no numpy), as a GPU machine's Python may have nothing else."""
    windows = []
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            data = bytearray(f.read())
        header = torch.frombuffer(data, dtype=torch.int32, count=256)
        count = int(header[2])
        tokens = torch.frombuffer(data, dtype=TOKEN_TYPES[int(header[0])], count=count, offset=1024)
        tokens = tokens.to(torch.int64)
        for start in range(0, count - seq_len, seq_len):
            windows.append(tokens[start:start + seq_len + 1])
    if not windows:
        sys.exit(f"no windows of {seq_len + 1} tokens in {pattern}")
    return windows


def read_dumped_config(path):
    """The sections of `mltrain --dump-config`'s YAML, which is two levels of `key: value` (strings
    quoted, lists such as data.sources in YAML's flow style), read without PyYAML, which a GPU
    machine's Python may lack. A list is kept as its text, or [] where it is empty: the reference
    reads no list, and refuses a config that has one."""
    config, section = {}, None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            key, _, value = line.strip().partition(":")
            if not line.startswith(" "):
                section = config.setdefault(key, {})
                continue
            value = value.strip()
            if value.startswith('"'):
                section[key] = json.loads(value)
            elif value.startswith("["):
                section[key] = [] if value == "[]" else value
            elif value in ("true", "false"):
                section[key] = value == "true"
            else:
                number = float(value)
                section[key] = int(number) if number.is_integer() and "." not in value and "e" not in value else number
    return config


def learning_rate(optim, max_steps, step):
    warmup = optim["warmup_steps"]
    if step <= warmup:
        return optim["lr"] * step / warmup
    progress = min(max((step - 1 - warmup) / max(1, max_steps - warmup), 0.0), 1.0)
    return optim["min_lr"] + (optim["lr"] - optim["min_lr"]) * 0.5 * (1 + math.cos(math.pi * progress))


def window_loss(model, window, bf16):
    with torch.autocast(window.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(window[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())


def mean_loss(model, windows, bf16):
    with torch.no_grad():
        losses = [window_loss(model, w, bf16) for w in windows]
    return float(torch.stack(losses).mean())


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the run's config, as mltrain --dump-config prints it")
    p.add_argument("--out", required=True, help="directory for metrics.jsonl")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    config = read_dumped_config(args.config)
    model = dict(config["model"])
    model["seq_len"] = config["data"]["seq_len"]
    model["untied"] = not model["tie_word_embeddings"]
    args.model = SimpleNamespace(**model)
    args.data = config["data"]
    args.optim = config["optim"]
    args.train = config["train"]
    if args.optim["name"] != "adamw" or args.optim["schedule"] != "cosine":
        sys.exit("the reference trains with AdamW on a cosine schedule only")
    if args.data.get("document_masking") or args.data.get("sources"):
        sys.exit("the reference reads one corpus with attention over whole windows: "
                 "no data.document_masking, no data.sources")
    return args


def main():
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    data, optim, train_keys = args.data, args.optim, args.train
    seq_len, micro_batch, grad_accum = data["seq_len"], data["micro_batch"], data["grad_accum"]
    max_steps = train_keys["max_steps"]
    device = torch.device("cuda" if train_keys["device"] == "cuda" else "cpu")
    bf16 = train_keys["precision"] == "bf16"
    torch.manual_seed(data["seed"])
    train = windows_of(data["train"], seq_len)
    val = windows_of(data["val"], seq_len)
    if train_keys["eval_batches"] > 0:  # 0: every window, as mltrain reads them
        val = val[:train_keys["eval_batches"] * micro_batch]
    val_batches = [torch.stack(val[i:i + micro_batch]).to(device)
                   for i in range(0, len(val), micro_batch)]
    model = MiniLlama(args.model).to(device)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": optim["weight_decay"]},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]), eps=optim["eps"], fused=True)
    order = torch.Generator().manual_seed(data["seed"])
    permutation, position = torch.randperm(len(train), generator=order), 0
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    with open(os.path.join(args.out, "metrics.jsonl"), "w") as metrics:
        # As mltrain's metrics.jsonl begins: the count says the model is the one mltrain trains.
        print(json.dumps({"event": "start", "parameters": sum(p.numel() for p in params)}),
              file=metrics, flush=True)
        for step in range(1, max_steps + 1):
            step_loss = 0.0
            for _ in range(grad_accum):
                rows = []
                for _ in range(micro_batch):
                    if position == len(permutation):
                        permutation, position = torch.randperm(len(train), generator=order), 0
                    rows.append(train[permutation[position]])
                    position += 1
                window = torch.stack(rows).to(device)
                loss = window_loss(model, window, bf16) / grad_accum
                loss.backward()
                step_loss += loss.item()
            torch.nn.utils.clip_grad_norm_(params, optim["grad_clip"], foreach=True)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(optim, max_steps, step)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % train_keys["log_every"] == 0 or step == max_steps:
                print(json.dumps({"step": step, "loss": step_loss, "elapsed_s": time.perf_counter() - start}),
                      file=metrics, flush=True)
            if step % train_keys["eval_every"] == 0 or step == max_steps:
                print(json.dumps({"step": step, "val_loss": mean_loss(model, val_batches, bf16)}),
                      file=metrics, flush=True)


if __name__ == "__main__":
    main()
