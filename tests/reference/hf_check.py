"""Hugging Face transformers as the independent reference of mltrain's export and import.

usage:
  hf_check.py load MODEL_DIR BATCH.safetensors OUT_DIR
      Loads MODEL_DIR with AutoModelForCausalLM.from_pretrained (no custom code), fails unless it
      is a LlamaForCausalLM that every weight was loaded into, and runs it on the batch.
  hf_check.py create CONFIG.json MAX_SHARD_SIZE MODEL_DIR BATCH.safetensors OUT_DIR
      Builds LlamaForCausalLM(LlamaConfig(**CONFIG)) with random weights (the norms too), saves it
      to MODEL_DIR with save_pretrained (MAX_SHARD_SIZE such as "20KB" shards it; "none" does not)
      and runs it on the batch.

BATCH holds "tokens" [B, T] int64 and optionally "targets" [B, T]. OUT_DIR receives
logits.safetensors ("logits" in fp32, and "loss", the mean next-token cross-entropy, when there
are targets) and info.json (the model's class, tying and special token ids as transformers sees
them).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig,
                          LlamaForCausalLM)


def run_batch(model, batch_path, out_dir):
    batch = load_file(batch_path)
    with torch.no_grad():
        logits = model(batch["tokens"]).logits.float()
    out = {"logits": logits.contiguous()}
    if "targets" in batch:
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        out["loss"] = loss.reshape(1)
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "logits.safetensors"))


def write_info(model, model_dir, out_dir):
    config = model.config
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    info = {
        "class": type(model).__name__,
        "tie_word_embeddings": config.tie_word_embeddings,
        "lm_head_is_embedding": tied,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "max_position_embeddings": config.max_position_embeddings,
    }
    if os.path.exists(os.path.join(model_dir, "generation_config.json")):
        generation = GenerationConfig.from_pretrained(model_dir)
        info["generation_bos_token_id"] = generation.bos_token_id
        info["generation_eos_token_id"] = generation.eos_token_id
    if os.path.exists(os.path.join(model_dir, "tokenizer_config.json")):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        info["tokenizer_bos_token_id"] = tokenizer.bos_token_id
        info["tokenizer_eos_token_id"] = tokenizer.eos_token_id
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f)


def load(model_dir, batch_path, out_dir):
    model, loading = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, output_loading_info=True)
    if type(model) is not LlamaForCausalLM:
        sys.exit(f"{model_dir} loads as {type(model).__name__}, not LlamaForCausalLM")
    problems = {kind: list(keys) for kind, keys in loading.items() if keys}
    if problems:
        sys.exit(f"{model_dir} did not load cleanly: {problems}")
    model.eval()
    run_batch(model, batch_path, out_dir)
    write_info(model, model_dir, out_dir)


def create(config_path, max_shard_size, model_dir, batch_path, out_dir):
    with open(config_path) as f:
        config = LlamaConfig(**json.load(f))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # The norms start as ones; random ones show a norm loaded into the wrong place.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
    model.eval()
    if max_shard_size == "none":
        model.save_pretrained(model_dir)
    else:
        model.save_pretrained(model_dir, max_shard_size=max_shard_size)
    run_batch(model, batch_path, out_dir)
    write_info(model, model_dir, out_dir)


if __name__ == "__main__":
    torch.set_num_threads(2)
    commands = {"load": load, "create": create}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
