#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>

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

// The checkpoints of a run, in RUN_DIR/checkpoints/step_00001000/: model.safetensors (Hugging Face
// names), optimizer.safetensors (AdamW moments and step counts), config.yaml (the effective config)
// and state.json (progress, RNG state, world size, versions, and a checksum of every other file).
// A checkpoint is written into step_XXXXXXXX.tmp/, every file and the directory flushed, then
// renamed: a directory with a final name is always complete. RUN_DIR/checkpoints/latest names the
// newest one.
class CheckpointStore {
 public:
  explicit CheckpointStore(const std::filesystem::path& run_dir);

  // Removes the .tmp directories of saves that a crash interrupted.
  void remove_stale_temporaries() const;

  // Saves and then keeps the newest keep_last checkpoints plus every multiple of keep_every
  // (0: none). A failed write removes its temporary directory, leaves every saved checkpoint as it
  // was, and throws a runtime error.
  std::filesystem::path save(const Llama& model, const AdamW& optimizer, const TrainingProgress& progress,
                             const Config& config, int64_t world_size) const;

  // The newest complete checkpoint, if any.
  std::optional<std::filesystem::path> latest() const;

  // RUN_DIR/checkpoints.
  const std::filesystem::path& directory() const { return directory_; }

 private:
  void prune(int64_t keep_last, int64_t keep_every) const;

  std::filesystem::path directory_;
};

// The weights file a path means: a .safetensors file itself, a checkpoint directory's
// model.safetensors, or a run directory's newest checkpoint. Nothing there is a UserError.
std::filesystem::path find_weights(const std::filesystem::path& path);

// Loads a checkpoint into the model and the optimizer after verifying every file's checksum. A
// missing, truncated or corrupted file, or a model shape that differs from config.model (every
// differing key listed), is a UserError naming the file; changed keys outside model are logged.
TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, Llama& model, AdamW& optimizer,
                                 const Config& config);

}  // namespace mltrain
