#pragma once

#include <filesystem>
#include <future>
#include <optional>

#include "trainer/checkpoint/checkpoint_store.h"

namespace mltrain {

// Saves a run's checkpoints into its CheckpointStore, either where it is called or, with
// train.async_checkpoint, on a thread of its own while training goes on. At most one write is in
// flight: a save waits for the one before. A background write is complete, flushed and renamed
// before `latest` names it (CheckpointStore::save), so a crash in the middle of one leaves the
// checkpoint before as the newest.
class CheckpointWriter {
 public:
  CheckpointWriter(const CheckpointStore& store, bool in_background, SaveObserver observe);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Waits for a write in flight: it becomes a good checkpoint even when the run ends by an error.
  ~CheckpointWriter();

  // Whether a save returns before its checkpoint is written: its contents must then be the host's
  // own copies (checkpoint_contents' host_copy).
  bool in_background() const { return in_background_; }

  // Saves `contents` and logs the checkpoint once it is complete; pruning keeps the checkpoint of
  // step `keep` (CheckpointStore::save). Here: returns its path. In the background: returns
  // nothing, once the write before (if any) has ended and this one has begun.
  std::optional<std::filesystem::path> save(CheckpointContents contents,
                                            std::optional<int64_t> keep = std::nullopt);

  // Rethrows the failure of a background write that has ended; returns at once otherwise.
  void check();

  // Waits for the write in flight, if any, and rethrows its failure; returns the checkpoint.
  std::optional<std::filesystem::path> wait();

 private:
  std::filesystem::path write(const CheckpointContents& contents,
                              std::optional<int64_t> keep) const;

  const CheckpointStore& store_;
  const bool in_background_;
  const SaveObserver observe_;
  std::future<std::filesystem::path> in_flight_;
};

}  // namespace mltrain
