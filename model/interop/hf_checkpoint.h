#pragma once

#include <filesystem>

#include "model/interop/hf_config.h"
#include "model/interop/safetensors.h"
#include "model/interop/weight_files.h"
#include "model/layers/llama.h"

namespace mltrain {

// A Hugging Face model directory as save_pretrained writes it: config.json, and the weights in
// model.safetensors or, sharded, in the files that model.safetensors.index.json's "weight_map"
// names for each tensor.

// Whether `directory` holds config.json and model.safetensors or model.safetensors.index.json.
bool is_hf_model_directory(const std::filesystem::path& directory);

// DIR/config.json, read by parse_hf_config.
HfConfig read_hf_config(const std::filesystem::path& directory);

// The directory's weights, opened to be read a tensor at a time: model.safetensors, or the shards
// of the index (which wins, as in transformers, when both are there). A bad index, a missing
// shard, a shard name that leaves the directory, or a tensor missing from the shard the index
// names is a UserError naming the file.
WeightFiles open_hf_weights(const std::filesystem::path& directory);

// Checks DIR/config.json against `ours`: every key that model_differences finds is listed, with
// both values, in one UserError.
void check_hf_model_config(const ModelConfig& ours, const std::filesystem::path& directory);

// The directory's weights for a model of `ours`, once check_hf_model_config has passed (and with
// a warning where `ours` has more positions than the model was trained for); load_hf_weights
// reads them into the model.
WeightFiles open_hf_model(const ModelConfig& ours, const std::filesystem::path& directory);
// All of them at once.
void load_hf_model(Llama& model, const std::filesystem::path& directory);

}  // namespace mltrain
