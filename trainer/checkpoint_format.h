#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>

#include "model/llama.h"
#include "trainer/adamw.h"
#include "trainer/config.h"

namespace mltrain {

// Where a run stands: what a checkpoint records besides the tensors. The data order is a function
// of samples_consumed, so it is the only data state there is.
struct TrainingProgress {
  int64_t step = 0;  // optimizer steps done
  int64_t samples_consumed = 0;
  int64_t tokens_seen = 0;
  double learning_rate = 0.0;  // of the last step
  double best_val_loss = std::numeric_limits<double>::infinity();
};

// One checkpoint directory: model.safetensors (Hugging Face names), optimizer.safetensors (AdamW
// moments and step counts), config.yaml (the effective config) and state.json (progress, RNG
// state, world size, versions, and an XXH3 checksum of every other file).

// Writes the files of a checkpoint into the existing, empty `directory`, each flushed to disk;
// `after_weights`, when set, runs once model.safetensors is complete (the tests' seam for a crash
// or a full disk in the middle of a save).
void write_checkpoint(const std::filesystem::path& directory, const Llama& model,
                      const OptimizerState& optimizer_state, const TrainingProgress& progress,
                      const Config& config, int64_t world_size,
                      const std::function<void(const std::filesystem::path&)>& after_weights = {});

// Checks every file that state.json lists against its checksum. A missing state, a damaged state,
// a missing, truncated or corrupted file is a UserError naming the file.
void verify_checkpoint(const std::filesystem::path& checkpoint);

// Verifies the checkpoint, then loads it into the model and the optimizer. A model shape that
// differs from config.model (every differing key listed) is a UserError; changed keys outside
// model are logged.
TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, Llama& model,
                                 Optimizer& optimizer, const Config& config);

}  // namespace mltrain
