#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "model/interop/safetensors.h"
#include "model/interop/weight_files.h"
#include "model/layers/llama.h"
#include "model/layers/named_parameter.h"

namespace mltrain {

// The model's parameters (themselves, gradients and all) in registration order, each under the
// Hugging Face LlamaForCausalLM name of what it holds, with the Hugging Face tensors it holds as
// its parts, e.g. layers.3.attn_norm.weight -> model.layers.3.input_layernorm.weight, itself its
// one part. The fused projections take vLLM's names for them: layers.3.attn.wqkv.weight is
// model.layers.3.self_attn.qkv_proj.weight, whose rows are q_proj's, then k_proj's, then
// v_proj's; layers.3.ffn.w_gate_up.weight is model.layers.3.mlp.gate_up_proj.weight, gate_proj's
// rows and then up_proj's. The layouts are otherwise the same (rotate-half RoPE, [out, in]
// projections), so weights map one to one without permutation.
NamedParameters hf_parameters(const Llama& model);

// The model's weights under Hugging Face names: each part of each parameter (hf_parameters), a
// view that shares storage with the model. Tied models have no lm_head.weight, as Hugging Face
// writes them.
NamedTensors hf_state_dict(const Llama& model);

// Copies tensors named as hf_state_dict names them into the model (casting floating dtypes).
// Missing, unexpected, wrongly shaped or non-floating tensors are one UserError that names
// `source` and lists every offending key.
void load_hf_state_dict(Llama& model, const NamedTensors& tensors, const std::string& source);

// The same from `files`, read a tensor at a time, into those of `parameters` that are the model's
// (all of them when empty): every tensor of the files is checked against the whole model first,
// so that files that do not match change nothing, and ZeRO-3 can load one unit at a time.
void load_hf_weights(Llama& model, const WeightFiles& files,
                     const std::vector<at::Tensor>& parameters = {});

// The metadata of a weights file that transformers reads: format pt.
const std::map<std::string, std::string>& hf_weights_metadata();

// Writes tensors named as hf_state_dict names them as a safetensors file that transformers reads
// (hf_weights_metadata).
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
