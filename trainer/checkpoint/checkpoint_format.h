#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/interop/safetensors.h"
#include "model/layers/llama.h"
#include "trainer/checkpoint/checkpoint_state.h"
#include "trainer/checkpoint/save_moment.h"
#include "trainer/config/config.h"
#include "trainer/optim/optimizer.h"

namespace mltrain {

// A checkpoint directory's name, step_00001000: the step in at least 8 digits.
std::string checkpoint_name(int64_t step);
// The step of a checkpoint directory's name; none for another name.
std::optional<int64_t> checkpoint_step(const std::string& name);

// One checkpoint directory: model.safetensors (Hugging Face names), optimizer.safetensors (AdamW
// moments and step counts), config.yaml (the effective config, its data paths absolute),
// tokenizer.model (the run's, when it has one) and state.json (progress, RNG state, world size,
// versions, and an XXH3 checksum of every other file): all a reader needs, wherever it is moved.

// What a rank writes of a checkpoint, taken at one step: its share of the tensor files (all of
// them where it is the only rank) and the rest, which rank 0 writes. With its tensors copied to
// host memory it no longer depends on the run: training goes on while it is written
// (train.async_checkpoint).
struct CheckpointContents {
  SafetensorsShare weights;  // hf_state_dict's names
  SafetensorsShare optimizer_state;
  TrainingProgress progress;
  Config config;
  std::string
      tokenizer_model;  // the bytes of the run's tokenizer, read when it started; empty: none
  int64_t world_size = 1;
  int64_t writers = 1;           // the ranks that write a share, from rank 0: all, or rank 0 alone
  std::vector<uint8_t> cpu_rng;  // the CPU generator's state at the step
};

// The ranks that save a checkpoint, as one of them sees them: whether it is rank 0 (the leader),
// and how many, from rank 0, write a share.
struct SavingRanks {
  bool leader = true;
  int64_t writing = 1;
};

// This rank's contents of a checkpoint of the run as it stands: the pieces of the weights and of
// the optimizer state that it alone holds (Optimizer::weights_share, state_share), and where every
// rank holds the same, the whole on rank 0 and nothing elsewhere. With rank 0 the one writer of
// several ranks, it gets the whole of both, gathered (the weights must be whole then:
// WholeWeights). A collective where the optimizer's state is whole only gathered
// (Optimizer::state). `host_copy`: every tensor is copied to host memory, so that the updates of
// the steps that follow do not reach it; else they are the model's and the optimizer's own.
CheckpointContents checkpoint_contents(const Llama& model, const Optimizer& optimizer,
                                       SavingRanks ranks, const TrainingProgress& progress,
                                       const Config& config, std::string tokenizer_model,
                                       int64_t world_size, bool host_copy);

// A checkpoint's files are written in three moves, so that every rank can write its own share of
// the tensors: rank 0 makes the tensor files at their full size in the existing, empty
// `directory` (make_tensor_files); each rank writes its pieces into them (write_tensor_share);
// once every rank has, rank 0 writes the config with its data paths made absolute, the tokenizer
// (when the run has one) and state.json, with the checksums of all (complete_checkpoint). Each
// file is flushed to disk. `observe`, when set, is called once the tensor files are complete and
// again once every file is (the tests' seam for a crash or a full disk in the middle of a save).
void make_tensor_files(const std::filesystem::path& directory, const CheckpointContents& contents);
void write_tensor_share(const std::filesystem::path& directory, const CheckpointContents& contents);
void complete_checkpoint(const std::filesystem::path& directory, const CheckpointContents& contents,
                         const SaveObserver& observe = {});

// The tokenizer that goes with `weights`: the copy its checkpoint holds, which moves with it, or
// else (weights outside a checkpoint, or a checkpoint of a run without a tokenizer) `config`'s
// data.tokenizer.
std::string tokenizer_for(const std::filesystem::path& weights, const Config& config);

// Reads state.json (read_checkpoint_state) and checks every file against its checksum there. A
// missing or damaged state, a missing, truncated or corrupted file is a UserError naming the file.
void verify_checkpoint(const std::filesystem::path& checkpoint);

// An intact checkpoint that does not fit the run: another model, or another optimizer's state. An
// older checkpoint of the run would not fit either.
class CheckpointMismatch : public UserError {
 public:
  using UserError::UserError;
};

// Verifies the checkpoint, then loads it into the model and the optimizer. A model that differs
// from config.model or config.lora (every differing key listed) or another optim.name is a
// CheckpointMismatch; changed keys outside model and lora are logged.
TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, Llama& model,
                                 Optimizer& optimizer, const Config& config);

// The adapters that the weights file `weights` was trained with: its checkpoint's lora.* (from
// the config.yaml beside it), whatever `config` says, as reading its adapters needs them; where
// the file is no checkpoint's, `config`'s.
LoraConfig checkpoint_lora(const std::filesystem::path& weights, const Config& config);

}  // namespace mltrain
