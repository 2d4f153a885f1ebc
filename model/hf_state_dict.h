#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "model/llama.h"
#include "model/safetensors.h"

namespace mltrain {

// The Hugging Face LlamaForCausalLM name of a parameter of ours, e.g.
// layers.3.attn.wq.weight -> model.layers.3.self_attn.q_proj.weight. The layouts are the same
// (rotate-half RoPE, [out, in] projections), so weights map one to one without permutation.
std::string hf_parameter_name(const std::string& name);

// The model's parameters (themselves, gradients and all) under Hugging Face names, in registration
// order.
std::vector<std::pair<std::string, at::Tensor>> hf_named_parameters(const Llama& model);

// The model's parameters under Hugging Face names. Tied models have no lm_head.weight, as
// Hugging Face writes them. The tensors share storage with the model.
NamedTensors hf_state_dict(const Llama& model);

// Copies tensors named as hf_state_dict names them into the model (casting floating dtypes).
// Missing, unexpected, wrongly shaped or non-floating tensors are one UserError that names
// `source` and lists every offending key.
void load_hf_state_dict(Llama& model, const NamedTensors& tensors, const std::string& source);

// Writes tensors named as hf_state_dict names them as a safetensors file that transformers reads
// (metadata format: pt).
void save_state_dict(const NamedTensors& state_dict, const std::filesystem::path& path);
void save_model_weights(const Llama& model, const std::filesystem::path& path);
void load_model_weights(Llama& model, const std::filesystem::path& path);

// Before a model of `config` is built to take the weights of `path`: a file too small to hold its
// parameters (2 bytes each, in bf16, at the least) cannot be its weights, and the model, built
// from a config that says otherwise, could take more memory than the machine has. A UserError
// naming both. `config_source` names where the config came from.
void check_weights_can_fill(const ModelConfig& config, const std::string& config_source,
                            const std::filesystem::path& path);

}  // namespace mltrain
