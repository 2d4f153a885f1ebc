#include "trainer/checkpoint/checkpoint_format.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "model/interop/hf_state_dict.h"
#include "model/interop/safetensors.h"
#include "model/interop/weight_files.h"

namespace mltrain {
namespace {

// XXH3 of a file's bytes, as 16 hex digits.
std::string file_checksum(const std::filesystem::path& path) {
  const InputFile in(path, "checkpoint file");
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(1 << 20);
  uint64_t offset = 0;
  while (const size_t count = in.read_some(offset, buffer.data(), buffer.size())) {
    XXH3_64bits_update(state, buffer.data(), count);
    offset += count;
  }
  const XXH64_hash_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", hash);
}

CheckpointState verified_state(const std::filesystem::path& checkpoint) {
  CheckpointState state = read_checkpoint_state(checkpoint);
  for (const auto& [name, checksum] : state.checksums) {
    const auto path = checkpoint / name;
    if (!std::filesystem::exists(path))
      throw UserError(fmt::format("{}: missing from the checkpoint", path.string()));
    if (file_checksum(path) != checksum) {
      throw UserError(
          fmt::format("{}: checksum mismatch: the file is corrupted or truncated", path.string()));
    }
  }
  return state;
}

// A checkpoint's file of tensors as every rank lays it out: alike on each, so that each rank's
// pieces land where rank 0's header says they are.
struct TensorFile {
  std::string name;
  SafetensorsLayout layout;
  const std::vector<TensorPiece>& pieces;  // this rank's
};

std::vector<TensorFile> tensor_files(const CheckpointContents& contents) {
  std::vector<TensorFile> files;
  files.push_back({"model.safetensors",
                   SafetensorsLayout(contents.weights.entries, hf_weights_metadata()),
                   contents.weights.pieces});
  files.push_back({"optimizer.safetensors", SafetensorsLayout(contents.optimizer_state.entries),
                   contents.optimizer_state.pieces});
  return files;
}

// The model keys of the checkpoint's config must equal the run's; other keys may change.
void check_config(const std::filesystem::path& checkpoint, const Config& config) {
  const Config saved = load_config(checkpoint / "config.yaml");
  std::vector<std::string> model_changes;
  // Compared as saved: a checkpoint of before the paths were saved absolute compares alike too.
  for (const ConfigChange& change :
       config_changes(with_absolute_data_paths(saved), with_absolute_data_paths(config))) {
    // model.init_from says where a fresh run's weights came from, not what the model is: a
    // resumed run takes the checkpoint's weights whatever it names.
    if (change.key == "optim.name") {
      throw CheckpointMismatch(fmt::format(
          "{}: the checkpoint holds the optimizer state of {}, and this run asks for {} "
          "(optim.name): resume with --set optim.name={}, or start a new run in another "
          "train.run_dir from its weights (mltrain --export-hf, then model.init_from)",
          checkpoint.string(), change.before, change.after, change.before));
    }
    // LoRA's adapters are the model's too: another rank, scale or set of targets reads the
    // checkpoint's adapters as other ones.
    if ((change.key.starts_with("model.") && change.key != "model.init_from") ||
        change.key.starts_with("lora.")) {
      model_changes.push_back(fmt::format("{} is {} in the checkpoint, {} in the config",
                                          change.key, change.before, change.after));
    } else {
      spdlog::info("changed since the checkpoint: {} {} -> {}", change.key, change.before,
                   change.after);
    }
  }
  if (!model_changes.empty()) {
    throw CheckpointMismatch(fmt::format(
        "{}: the checkpoint is of another model: {}: resume it with the model keys it was saved "
        "with (its config.yaml has them), or train this model in another train.run_dir",
        checkpoint.string(), fmt::join(model_changes, "; ")));
  }
}

}  // namespace

LoraConfig checkpoint_lora(const std::filesystem::path& weights, const Config& config) {
  const std::filesystem::path saved = weights.parent_path() / "config.yaml";
  if (!std::filesystem::exists(weights.parent_path() / "state.json") ||
      !std::filesystem::exists(saved))
    return config.lora;
  return load_config(saved).lora;
}

std::string checkpoint_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::optional<int64_t> checkpoint_step(const std::string& name) {
  const std::string_view prefix = "step_";
  const std::string_view digits =
      std::string_view(name).substr(std::min(name.size(), prefix.size()));
  // int64 holds 18 digits whatever they are.
  if (!name.starts_with(prefix) || digits.size() < 8 || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(std::string(digits));
}

CheckpointContents checkpoint_contents(const Llama& model, const Optimizer& optimizer,
                                       SavingRanks ranks, const TrainingProgress& progress,
                                       const Config& config, std::string tokenizer_model,
                                       int64_t world_size, bool host_copy) {
  const bool each_rank_writes = ranks.writing == world_size;
  // Every rank asks for the state, which may be a collective; only rank 0 gets a gathered one.
  std::optional<SafetensorsShare> state = each_rank_writes ? optimizer.state_share() : std::nullopt;
  if (!state) {
    const OptimizerState gathered = optimizer.state();
    state = ranks.leader ? whole_share(gathered) : SafetensorsShare{};
  }
  std::optional<SafetensorsShare> weights =
      each_rank_writes ? optimizer.weights_share() : std::nullopt;
  if (!weights) weights = ranks.leader ? whole_share(hf_state_dict(model)) : SafetensorsShare{};
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  CheckpointContents contents{
      .weights = std::move(*weights),
      .optimizer_state = std::move(*state),
      .progress = progress,
      .config = config,
      .tokenizer_model = std::move(tokenizer_model),
      .world_size = world_size,
      .writers = ranks.writing,
      .cpu_rng = {rng.data_ptr<uint8_t>(), rng.data_ptr<uint8_t>() + rng.numel()}};
  if (host_copy) {
    for (SafetensorsShare* share : {&contents.weights, &contents.optimizer_state}) {
      for (TensorPiece& piece : share->pieces)
        piece.values = piece.values.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  return contents;
}

void make_tensor_files(const std::filesystem::path& directory, const CheckpointContents& contents) {
  for (const TensorFile& file : tensor_files(contents))
    create_safetensors(directory / file.name, file.layout);
}

void write_tensor_share(const std::filesystem::path& directory,
                        const CheckpointContents& contents) {
  for (const TensorFile& file : tensor_files(contents)) {
    if (!file.pieces.empty())
      write_safetensors_pieces(directory / file.name, file.layout, file.pieces);
  }
}

void complete_checkpoint(const std::filesystem::path& directory, const CheckpointContents& contents,
                         const SaveObserver& observe) {
  if (observe) observe(SaveMoment::weights_written, directory);
  write_file_atomically(directory / "config.yaml",
                        config_to_yaml(with_absolute_data_paths(contents.config)));
  const bool with_tokenizer = !contents.tokenizer_model.empty();
  if (with_tokenizer)
    write_file_atomically(directory / kCheckpointTokenizer, contents.tokenizer_model);

  CheckpointState state{.progress = contents.progress,
                        .world_size = contents.world_size,
                        .cpu_rng = contents.cpu_rng,
                        .checksums = {}};
  for (const std::string& name : checkpoint_files())
    state.checksums[name] = file_checksum(directory / name);
  if (with_tokenizer) {
    const std::string name(kCheckpointTokenizer);
    state.checksums[name] = file_checksum(directory / name);
  }
  write_file_atomically(directory / "state.json", checkpoint_state_json(state));
  if (observe) observe(SaveMoment::files_written, directory);
}

std::string tokenizer_for(const std::filesystem::path& weights, const Config& config) {
  // The copy is the checkpoint's when its state.json vouches for it with a checksum.
  const std::filesystem::path checkpoint = std::filesystem::absolute(weights).parent_path();
  if (std::filesystem::exists(checkpoint / "state.json") &&
      read_checkpoint_state(checkpoint).checksums.contains(std::string(kCheckpointTokenizer)))
    return (checkpoint / kCheckpointTokenizer).string();
  return config.data.tokenizer;
}

void verify_checkpoint(const std::filesystem::path& checkpoint) { verified_state(checkpoint); }

TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, Llama& model,
                                 Optimizer& optimizer, const Config& config) {
  CheckpointState state = verified_state(checkpoint);
  check_config(checkpoint, config);
  const TrainingProgress& progress = state.progress;
  // A sample is a window of data.seq_len tokens, at most model.max_seq_len.
  if (static_cast<double>(progress.tokens_seen) >
      static_cast<double>(progress.samples_consumed) *
          static_cast<double>(config.model.max_seq_len)) {
    throw UserError(fmt::format(
        "{}: \"tokens_seen\" ({}) is more than \"samples_consumed\" ({}) windows of at most "
        "model.max_seq_len ({}) tokens hold",
        (checkpoint / "state.json").string(), progress.tokens_seen, progress.samples_consumed,
        config.model.max_seq_len));
  }
  const WeightFiles weights(checkpoint / "model.safetensors");
  optimizer.fill_weights(model->parameters(), [&](const std::vector<at::Tensor>& parameters) {
    load_hf_weights(model, weights, parameters);
  });
  // A sharded state is read part by part, each rank its own; any other whole.
  const std::filesystem::path state_file = checkpoint / "optimizer.safetensors";
  const SafetensorsReader state_reader(state_file);
  if (!optimizer.load_own_state(state_reader, state_file.string()))
    optimizer.load_state(state_reader.read_all(), state_file.string());
  const at::Tensor rng =
      at::from_blob(state.cpu_rng.data(), {static_cast<int64_t>(state.cpu_rng.size())}, at::kByte);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng.clone());
  spdlog::info("resuming from {}: step {}, {} samples consumed{}", checkpoint.string(),
               progress.step, progress.samples_consumed,
               state.world_size == 1 ? "" : fmt::format(" (saved by {} ranks)", state.world_size));
  return progress;
}

}  // namespace mltrain
