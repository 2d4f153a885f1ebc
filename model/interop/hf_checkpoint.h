#pragma once

#include <filesystem>

#include "model/interop/hf_config.h"
#include "model/interop/safetensors.h"
#include "model/layers/llama.h"

namespace mltrain {

// A Hugging Face model directory as save_pretrained writes it: config.json, and the weights in
// model.safetensors or, sharded, in the files that model.safetensors.index.json's "weight_map"
// names for each tensor.

// Whether `directory` holds config.json and model.safetensors or model.safetensors.index.json.
bool is_hf_model_directory(const std::filesystem::path& directory);

// DIR/config.json, read by parse_hf_config.
HfConfig read_hf_config(const std::filesystem::path& directory);

// Every tensor of the directory's weights, from model.safetensors or from the shards of the
// index (which wins, as in transformers, when both are there). A bad index, a missing shard, a
// shard name that leaves the directory, or a tensor missing from the shard the index names is a
// UserError naming the file.
NamedTensors load_hf_tensors(const std::filesystem::path& directory);

// Checks DIR/config.json against `ours`: every key that model_differences finds is listed, with
// both values, in one UserError.
void check_hf_model_config(const ModelConfig& ours, const std::filesystem::path& directory);

// Loads the directory's weights into `model` once check_hf_model_config has passed.
void load_hf_model(Llama& model, const std::filesystem::path& directory);

}  // namespace mltrain
