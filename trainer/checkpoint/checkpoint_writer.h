#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <optional>

#include "trainer/checkpoint/checkpoint_store.h"

namespace mltrain {

// Saves a rank's share of a run's checkpoints into its CheckpointStore, as the ranks save one
// together (CheckpointStore::begin), either where it is called or, with train.async_checkpoint,
// on a thread of its own while training goes on: there every rank writes its share, and rank 0
// awaits the others' marks and finishes the checkpoint. At most one write is in flight: a save
// waits for the one before. A background write is complete, flushed and renamed before `latest`
// names it, so a crash in the middle of one leaves the checkpoint before as the newest.
class CheckpointWriter {
 public:
  // `share_patience`: how long rank 0, writing in the background, awaits the next rank's mark.
  CheckpointWriter(const CheckpointStore& store, int rank, bool in_background,
                   std::chrono::seconds share_patience, SaveObserver observe);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Waits for a write in flight: it becomes a good checkpoint even when the run ends by an error,
  // unless it still awaits a rank's share.
  ~CheckpointWriter();

  // Whether a save returns before its checkpoint is written: its contents must then be the host's
  // own copies (checkpoint_contents' host_copy).
  bool in_background() const { return in_background_; }

  // Rank 0, before any rank saves `contents`: the checkpoint begun. The write before must have
  // ended (wait()).
  void begin(const CheckpointContents& contents) const { store_.begin(contents); }

  // Every rank, once rank 0 has begun: writes this rank's share of `contents` here, or starts
  // writing it in the background (and on rank 0, finishing the checkpoint once every rank's share
  // is written, pruning as finish() does) and returns once the write before has ended.
  void save(const CheckpointContents& contents, std::optional<int64_t> keep = std::nullopt);

  // Rank 0, once every rank's share is written here: completes the checkpoint and logs it;
  // pruning keeps the checkpoint of step `keep` (CheckpointStore::finish).
  std::filesystem::path finish(const CheckpointContents& contents,
                               std::optional<int64_t> keep = std::nullopt) const;

  // The save of `step` given up after a failure (CheckpointStore::abandon).
  void abandon(int64_t step) const { store_.abandon(step); }

  // Rethrows the failure of a background write that has ended; returns at once otherwise.
  void check();

  // Waits for the write in flight, if any, and rethrows its failure; returns the checkpoint, on
  // rank 0.
  std::optional<std::filesystem::path> wait();

 private:
  std::optional<std::filesystem::path> write_in_background(const CheckpointContents& contents,
                                                           std::optional<int64_t> keep) const;

  const CheckpointStore& store_;
  const int rank_;
  const bool in_background_;
  const std::chrono::seconds share_patience_;
  const SaveObserver observe_;
  std::atomic<bool> abandoned_ = false;
  std::future<std::optional<std::filesystem::path>> in_flight_;
};

}  // namespace mltrain
