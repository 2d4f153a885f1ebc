#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/layers/model_config.h"

namespace mltrain {

// What a Hugging Face LlamaForCausalLM config.json says about a model of ours: its shape and the
// ids of its special tokens (absent where the run had no tokenizer).
struct HfConfig {
  ModelConfig model;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  // the first, where config.json lists several
};

// config.json for `config`: LlamaForCausalLM in float32, SwiGLU (silu), no biases, default RoPE.
// Written in both the transformers 5 spelling ("dtype", "rope_parameters") and the older one
// ("torch_dtype", top-level "rope_theta"), so that old and new versions read the same model.
std::string hf_config_json(const HfConfig& config);

// generation_config.json: the special token ids generate() starts and stops at.
std::string hf_generation_config_json(const HfConfig& config);

// Reads config.json text in either spelling, with LlamaConfig's defaults for absent keys, as
// transformers reads it. What mltrain's model does not compute (a model_type other than llama,
// hidden_act other than silu, attention or MLP biases, RoPE scaling) and values of the wrong type
// are a UserError naming `source` and the key.
HfConfig parse_hf_config(const std::string& text, const std::string& source);

// A `model.*` key whose value differs between two model configs, as the YAML config shows it.
struct ModelKeyDifference {
  std::string key;  // "model.d_model"
  std::string ours;
  std::string theirs;
};

// The keys that change the function a model computes and that differ. Not compared: max_seq_len,
// which only sizes the rotary tables (the rotation at a position does not depend on it), and
// init_std, which only draws initial weights that loaded ones replace.
std::vector<ModelKeyDifference> model_differences(const ModelConfig& ours,
                                                  const ModelConfig& theirs);

}  // namespace mltrain
