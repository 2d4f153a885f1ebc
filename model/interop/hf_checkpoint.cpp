#include "model/interop/hf_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"
#include "model/interop/hf_state_dict.h"

namespace mltrain {
namespace {

const char* const kIndexName = "model.safetensors.index.json";

// The index's "weight_map" turned around: each shard's file name and the tensors in it. A shard
// name must be a file of the directory, so that an index cannot make us read elsewhere.
std::map<std::string, std::vector<std::string>> shard_contents(const std::filesystem::path& index) {
  std::map<std::string, std::vector<std::string>> contents;
  try {
    const nlohmann::json weight_map =
        nlohmann::json::parse(read_text_file(index, "safetensors index")).at("weight_map");
    for (const auto& [tensor, shard] : weight_map.items()) {
      const std::string name = shard.get<std::string>();
      if (name.empty() || std::filesystem::path(name).filename() != name || name == "." ||
          name == "..") {
        throw UserError(fmt::format("{}: the shard \"{}\" of {} is not a file name", index.string(),
                                    name, tensor));
      }
      contents[name].push_back(tensor);
    }
  } catch (const nlohmann::json::exception& error) {
    throw UserError(fmt::format(
        "{}: not a safetensors index (a JSON object with a \"weight_map\" of tensor names to "
        "shard files): {}",
        index.string(), error.what()));
  }
  return contents;
}

// The shards are all checked to be there before any is opened: a missing one is named at once.
WeightFiles open_shards(const std::filesystem::path& directory) {
  const std::filesystem::path index = directory / kIndexName;
  const auto contents = shard_contents(index);
  std::vector<std::string> missing;
  std::vector<std::pair<std::filesystem::path, std::vector<std::string>>> files;
  for (const auto& [shard, tensors] : contents) {
    if (!std::filesystem::is_regular_file(directory / shard)) {
      missing.push_back(
          fmt::format("{} (holding {} tensors, {} the first)", shard, tensors.size(), tensors[0]));
    }
    files.emplace_back(directory / shard, tensors);
  }
  if (!missing.empty()) {
    throw UserError(fmt::format("{} names shards missing from {}: {}", index.string(),
                                directory.string(), fmt::join(missing, ", ")));
  }
  return WeightFiles(files, index.string());
}

}  // namespace

bool is_hf_model_directory(const std::filesystem::path& directory) {
  return std::filesystem::is_regular_file(directory / "config.json") &&
         (std::filesystem::is_regular_file(directory / "model.safetensors") ||
          std::filesystem::is_regular_file(directory / kIndexName));
}

HfConfig read_hf_config(const std::filesystem::path& directory) {
  const std::filesystem::path path = directory / "config.json";
  return parse_hf_config(read_text_file(path, "Hugging Face config"), path.string());
}

WeightFiles open_hf_weights(const std::filesystem::path& directory) {
  if (std::filesystem::exists(directory / kIndexName)) return open_shards(directory);
  if (std::filesystem::exists(directory / "model.safetensors"))
    return WeightFiles(directory / "model.safetensors");
  throw UserError(fmt::format(
      "{}: no model.safetensors or {} (save the model with save_pretrained, which writes "
      "safetensors)",
      directory.string(), kIndexName));
}

void check_hf_model_config(const ModelConfig& ours, const std::filesystem::path& directory) {
  const std::string config_path = (directory / "config.json").string();
  const HfConfig theirs = read_hf_config(directory);
  std::vector<std::string> differences;
  for (const ModelKeyDifference& difference : model_differences(ours, theirs.model)) {
    differences.push_back(fmt::format("{}: {} in the config, {} in {}", difference.key,
                                      difference.ours, difference.theirs, config_path));
  }
  if (!differences.empty()) {
    throw UserError(fmt::format("{} is another model than the config describes: {}",
                                directory.string(), fmt::join(differences, "; ")));
  }
}

WeightFiles open_hf_model(const ModelConfig& ours, const std::filesystem::path& directory) {
  check_hf_model_config(ours, directory);
  const HfConfig theirs = read_hf_config(directory);
  if (ours.max_seq_len > theirs.model.max_seq_len) {
    spdlog::warn(
        "{}: model.max_seq_len {} is longer than the {} positions (max_position_embeddings) it "
        "was trained for",
        directory.string(), ours.max_seq_len, theirs.model.max_seq_len);
  }
  return open_hf_weights(directory);
}

void load_hf_model(Llama& model, const std::filesystem::path& directory) {
  load_hf_weights(model, open_hf_model(model->config(), directory));
}

}  // namespace mltrain
