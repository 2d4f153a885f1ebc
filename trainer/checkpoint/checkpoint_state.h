#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain {

// Where a run stands: what a checkpoint records besides the tensors. The data order is a function
// of samples_consumed, so it is the only data state there is.
// A source of a blend (data.sources) as a checkpoint records it.
struct SourceProgress {
  std::string name;
  double weight = 0.0;
  int64_t consumed = 0;           // its samples among the run's samples_consumed
  int64_t consumed_at_start = 0;  // its samples before the blend's start
};

struct TrainingProgress {
  int64_t step = 0;  // optimizer steps done
  int64_t samples_consumed = 0;
  int64_t tokens_seen = 0;
  double learning_rate = 0.0;  // of the last step
  double best_val_loss = std::numeric_limits<double>::infinity();
  double loss_level = 0.0;  // the spike guard's running level (spike_guard.h); 0: none yet
  // data.sources: each source's count, and the sample from which their weights apply
  // (data/blended_sampler.h's segment); empty for one corpus, as in checkpoints before blends.
  std::vector<SourceProgress> sources;
  int64_t blend_start = 0;
};

// A checkpoint's state.json: the progress, the world size that saved it, the CPU generator's
// state, and the XXH3 checksum (16 hex digits) of each of the checkpoint's other files.
struct CheckpointState {
  TrainingProgress progress;
  int64_t world_size = 1;
  std::vector<uint8_t> cpu_rng;
  std::map<std::string, std::string> checksums;  // by file name
};

// The files every checkpoint holds besides state.json, each with its checksum there.
inline const std::vector<std::string>& checkpoint_files() {
  static const std::vector<std::string> files = {"model.safetensors", "optimizer.safetensors",
                                                 "config.yaml"};
  return files;
}

// The copy of the run's tokenizer that a checkpoint holds when the run has one, checksummed like
// the others, so that a checkpoint is used (sampled, exported) wherever it is moved.
inline constexpr std::string_view kCheckpointTokenizer = "tokenizer.model";

// state.json's text for `state` (and the versions that wrote it).
std::string checkpoint_state_json(const CheckpointState& state);

// Reads CHECKPOINT/state.json as strictly as a config: every key of the right type and in range,
// the counts consistent with each other (a step consumes samples, a sample tokens) and with the
// directory's name, the generator state of this LibTorch's size, a checksum for each file (and
// the tokenizer, when there is one) and none for another. Anything else is a UserError that names
// the file and the key.
CheckpointState read_checkpoint_state(const std::filesystem::path& checkpoint);

}  // namespace mltrain
