#include "trainer/checkpoint_format.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>
#include <xxhash.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "model/hf_state_dict.h"
#include "model/safetensors.h"

namespace mltrain {
namespace {

constexpr int kStateFormat = 1;

// XXH3 of a file's bytes, as 16 hex digits.
std::string file_checksum(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot read checkpoint file", path.string()));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(1 << 20);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(in.gcount()));
  }
  const XXH64_hash_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", hash);
}

std::string hex(const at::Tensor& bytes) {
  std::string text;
  const auto* data = bytes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < bytes.numel(); ++i) text += fmt::format("{:02x}", data[i]);
  return text;
}

at::Tensor from_hex(const std::string& text) {
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size() / 2)}, at::kByte);
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    bytes.data_ptr<uint8_t>()[i] =
        static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

nlohmann::json read_state(const std::filesystem::path& checkpoint) {
  const auto path = checkpoint / "state.json";
  std::ifstream in(path);
  if (!in)
    throw UserError(fmt::format("{}: not a checkpoint (no state.json)", checkpoint.string()));
  try {
    nlohmann::json state = nlohmann::json::parse(in);
    if (state.at("format").get<int>() != kStateFormat) {
      throw UserError(fmt::format("{}: checkpoint format {} is not {}", path.string(),
                                  state["format"].dump(), kStateFormat));
    }
    return state;
  } catch (const nlohmann::json::exception& error) {
    throw UserError(fmt::format("{}: damaged checkpoint state ({})", path.string(), error.what()));
  }
}

void verify_files(const std::filesystem::path& checkpoint, const nlohmann::json& state) {
  for (const auto& [name, checksum] : state.at("checksums_xxh3").items()) {
    const auto path = checkpoint / name;
    if (!std::filesystem::exists(path))
      throw UserError(fmt::format("{}: missing from the checkpoint", path.string()));
    if (file_checksum(path) != checksum.get<std::string>()) {
      throw UserError(
          fmt::format("{}: checksum mismatch: the file is corrupted or truncated", path.string()));
    }
  }
}

// The model keys of the checkpoint's config must equal the run's; other keys may change.
void check_config(const std::filesystem::path& checkpoint, const Config& config) {
  const Config saved = load_config(checkpoint / "config.yaml");
  std::vector<std::string> model_changes;
  for (const ConfigChange& change : config_changes(saved, config)) {
    // model.init_from says where a fresh run's weights came from, not what the model is: a
    // resumed run takes the checkpoint's weights whatever it names.
    if (change.key.starts_with("model.") && change.key != "model.init_from") {
      model_changes.push_back(fmt::format("{} is {} in the checkpoint, {} in the config",
                                          change.key, change.before, change.after));
    } else {
      spdlog::info("changed since the checkpoint: {} {} -> {}", change.key, change.before,
                   change.after);
    }
  }
  if (!model_changes.empty()) {
    throw UserError(fmt::format("{}: the checkpoint is of another model: {}", checkpoint.string(),
                                fmt::join(model_changes, "; ")));
  }
}

}  // namespace

void write_checkpoint(const std::filesystem::path& directory, const Llama& model,
                      const OptimizerState& optimizer_state, const TrainingProgress& progress,
                      const Config& config, int64_t world_size,
                      const std::function<void(const std::filesystem::path&)>& after_weights) {
  save_model_weights(model, directory / "model.safetensors");
  if (after_weights) after_weights(directory);
  save_safetensors(directory / "optimizer.safetensors", optimizer_state);
  write_file_atomically(directory / "config.yaml", config_to_yaml(config));

  nlohmann::json files = nlohmann::json::object();
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "config.yaml"}) {
    files[name] = file_checksum(directory / name);
  }
  const nlohmann::json state = {
      {"format", kStateFormat},
      {"step", progress.step},
      {"samples_consumed", progress.samples_consumed},
      {"tokens_seen", progress.tokens_seen},
      {"learning_rate", progress.learning_rate},
      {"best_val_loss", std::isfinite(progress.best_val_loss)
                            ? nlohmann::json(progress.best_val_loss)
                            : nlohmann::json()},
      {"world_size", world_size},
      {"rng", {{"cpu", hex(at::detail::getDefaultCPUGenerator().get_state())}}},
      {"checksums_xxh3", files},
      {"versions", {{"mltrain", MLTRAIN_VERSION}, {"torch", TORCH_VERSION}}},
  };
  write_file_atomically(directory / "state.json", state.dump(2) + "\n");
}

void verify_checkpoint(const std::filesystem::path& checkpoint) {
  verify_files(checkpoint, read_state(checkpoint));
}

TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, Llama& model,
                                 Optimizer& optimizer, const Config& config) {
  const nlohmann::json state = read_state(checkpoint);
  verify_files(checkpoint, state);
  check_config(checkpoint, config);
  load_model_weights(model, checkpoint / "model.safetensors");
  optimizer.load_state(load_safetensors(checkpoint / "optimizer.safetensors"),
                       (checkpoint / "optimizer.safetensors").string());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(from_hex(state.at("rng").at("cpu").get<std::string>()));

  TrainingProgress progress;
  progress.step = state.at("step").get<int64_t>();
  progress.samples_consumed = state.at("samples_consumed").get<int64_t>();
  progress.tokens_seen = state.at("tokens_seen").get<int64_t>();
  progress.learning_rate = state.at("learning_rate").get<double>();
  if (state.at("best_val_loss").is_number())
    progress.best_val_loss = state["best_val_loss"].get<double>();
  const int64_t saved_world = state.at("world_size").get<int64_t>();
  spdlog::info("resuming from {}: step {}, {} samples consumed{}", checkpoint.string(),
               progress.step, progress.samples_consumed,
               saved_world == 1 ? "" : fmt::format(" (saved by {} ranks)", saved_world));
  return progress;
}

}  // namespace mltrain
