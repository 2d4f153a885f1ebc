#include "trainer/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>
#include <xxhash.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "model/hf_state_dict.h"
#include "trainer/fault_injection.h"

namespace mltrain {
namespace {

constexpr int kStateFormat = 1;
const std::regex kCheckpointName(R"(step_(\d{8}))");

std::string checkpoint_name(int64_t step) { return fmt::format("step_{:08d}", step); }

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
    bytes.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

void write_checkpoint_files(const std::filesystem::path& directory, const Llama& model, const AdamW& optimizer,
                            const TrainingProgress& progress, const Config& config, int64_t world_size) {
  save_model_weights(model, directory / "model.safetensors");
  if (fault_injected("kill-during-checkpoint")) std::raise(SIGKILL);
  if (fault_injected("fail-checkpoint-write")) {
    throw std::runtime_error(fmt::format("cannot write {}: No space left on device (injected)",
                                         (directory / "optimizer.safetensors").string()));
  }
  save_safetensors(directory / "optimizer.safetensors", optimizer.state());
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
      {"best_val_loss", std::isfinite(progress.best_val_loss) ? nlohmann::json(progress.best_val_loss) : nlohmann::json()},
      {"world_size", world_size},
      {"rng", {{"cpu", hex(at::detail::getDefaultCPUGenerator().get_state())}}},
      {"checksums_xxh3", files},
      {"versions", {{"mltrain", MLTRAIN_VERSION}, {"torch", TORCH_VERSION}}},
  };
  write_file_atomically(directory / "state.json", state.dump(2) + "\n");
}

nlohmann::json read_state(const std::filesystem::path& checkpoint) {
  const auto path = checkpoint / "state.json";
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("{}: not a checkpoint (no state.json)", checkpoint.string()));
  try {
    nlohmann::json state = nlohmann::json::parse(in);
    if (state.at("format").get<int>() != kStateFormat) {
      throw UserError(fmt::format("{}: checkpoint format {} is not {}", path.string(), state["format"].dump(), kStateFormat));
    }
    return state;
  } catch (const nlohmann::json::exception& error) {
    throw UserError(fmt::format("{}: damaged checkpoint state ({})", path.string(), error.what()));
  }
}

// The model keys of the checkpoint's config must equal the run's; other keys may change.
void check_config(const std::filesystem::path& checkpoint, const Config& config) {
  const Config saved = load_config(checkpoint / "config.yaml");
  std::vector<std::string> model_changes;
  for (const ConfigChange& change : config_changes(saved, config)) {
    if (change.key.starts_with("model.")) {
      model_changes.push_back(fmt::format("{} is {} in the checkpoint, {} in the config", change.key, change.before, change.after));
    } else {
      spdlog::info("changed since the checkpoint: {} {} -> {}", change.key, change.before, change.after);
    }
  }
  if (!model_changes.empty()) {
    throw UserError(fmt::format("{}: the checkpoint is of another model: {}", checkpoint.string(),
                                fmt::join(model_changes, "; ")));
  }
}

}  // namespace

CheckpointStore::CheckpointStore(const std::filesystem::path& run_dir) : directory_(run_dir / "checkpoints") {}

void CheckpointStore::remove_stale_temporaries() const {
  if (!std::filesystem::exists(directory_)) return;
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    if (entry.path().extension() == ".tmp") {
      spdlog::warn("removing {}, left by an interrupted checkpoint save", entry.path().string());
      std::filesystem::remove_all(entry.path());
    }
  }
}

std::filesystem::path CheckpointStore::save(const Llama& model, const AdamW& optimizer,
                                            const TrainingProgress& progress, const Config& config,
                                            int64_t world_size) const {
  const std::filesystem::path final_path = directory_ / checkpoint_name(progress.step);
  const std::filesystem::path temporary = directory_ / (checkpoint_name(progress.step) + ".tmp");
  try {
    std::filesystem::create_directories(directory_);
    std::filesystem::remove_all(temporary);
    std::filesystem::create_directory(temporary);
    write_checkpoint_files(temporary, model, optimizer, progress, config, world_size);
    fsync_directory(temporary);
    std::filesystem::remove_all(final_path);  // a checkpoint of this step from an earlier attempt
    std::filesystem::rename(temporary, final_path);
    fsync_directory(directory_);
    write_file_atomically(directory_ / "latest", checkpoint_name(progress.step) + "\n");
  } catch (const std::exception& error) {
    std::error_code ignored;
    std::filesystem::remove_all(temporary, ignored);
    throw std::runtime_error(fmt::format("saving the checkpoint of step {} failed: {}; the earlier "
                                         "checkpoints are kept",
                                         progress.step, error.what()));
  }
  prune(config.train.keep_last, config.train.keep_every);
  return final_path;
}

void CheckpointStore::prune(int64_t keep_last, int64_t keep_every) const {
  std::vector<int64_t> steps;
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, match, kCheckpointName)) steps.push_back(std::stoll(match[1]));
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = static_cast<size_t>(keep_last); i < steps.size(); ++i) {
    if (keep_every > 0 && steps[i] % keep_every == 0) continue;
    std::filesystem::remove_all(directory_ / checkpoint_name(steps[i]));
  }
}

std::optional<std::filesystem::path> CheckpointStore::latest() const {
  if (!std::filesystem::exists(directory_)) return std::nullopt;
  std::optional<std::filesystem::path> newest;
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, kCheckpointName) &&
        (!newest || name > newest->filename().string())) {
      newest = entry.path();
    }
  }
  return newest;
}

std::filesystem::path find_weights(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) return path;
  if (std::filesystem::exists(path / "model.safetensors")) return path / "model.safetensors";
  if (const auto latest = CheckpointStore(path).latest()) return *latest / "model.safetensors";
  throw UserError(fmt::format("{}: no weights here: give a .safetensors file, a checkpoint directory "
                              "or a run directory with checkpoints (train first)",
                              path.string()));
}

TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, Llama& model, AdamW& optimizer,
                                 const Config& config) {
  const nlohmann::json state = read_state(checkpoint);
  for (const auto& [name, checksum] : state.at("checksums_xxh3").items()) {
    const auto path = checkpoint / name;
    if (!std::filesystem::exists(path)) throw UserError(fmt::format("{}: missing from the checkpoint", path.string()));
    if (file_checksum(path) != checksum.get<std::string>()) {
      throw UserError(fmt::format("{}: checksum mismatch: the file is corrupted or truncated", path.string()));
    }
  }
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
  if (state.at("best_val_loss").is_number()) progress.best_val_loss = state["best_val_loss"].get<double>();
  const int64_t saved_world = state.at("world_size").get<int64_t>();
  spdlog::info("resuming from {}: step {}, {} samples consumed{}", checkpoint.string(), progress.step,
               progress.samples_consumed,
               saved_world == 1 ? "" : fmt::format(" (saved by {} ranks)", saved_world));
  return progress;
}

}  // namespace mltrain
