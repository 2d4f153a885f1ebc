#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "trainer/checkpoint/checkpoint_format.h"

namespace mltrain {

// The checkpoints of a run: RUN_DIR/checkpoints/step_00001000/ (checkpoint_format.h), and
// RUN_DIR/checkpoints/latest, the one source of truth for which checkpoint is the newest. A
// checkpoint is written into step_XXXXXXXX.tmp/ and renamed once complete, and only then does
// `latest` name it: a directory with a final name is always complete, and `latest` names one.
// Where `latest` is missing (a save killed just before writing it), the newest checkpoint stands
// in for it.
class CheckpointStore {
 public:
  explicit CheckpointStore(const std::filesystem::path& run_dir);

  // Before a run trains: checks what would otherwise fail only at its first save (a `latest` that
  // is not a file, a directory that cannot be written), each a UserError, and removes the .tmp
  // directories of saves that a crash interrupted.
  void prepare_for_saving() const;

  // The ranks of a run save one checkpoint together, each writing what it alone holds
  // (CheckpointContents), none gathering the model:
  //   1. rank 0 begins it: the checkpoint's temporary directory made anew, its tensor files made
  //      at their full size;
  //   2. the ranks meet, so that none writes into a directory not yet made;
  //   3. every rank writes its share into the files;
  //   4. once every rank's share is written (they meet again; or, writing in the background,
  //      every rank but 0 marks its share written or failed in the directory, and rank 0 awaits
  //      the marks), rank 0 finishes it: completed and put in its place.
  // A failure of begin(), await_shares() or finish() removes the temporary directory (as give_up
  // does), leaves every saved checkpoint as it was, and throws a runtime error; one elsewhere is
  // followed by abandon().
  void begin(const CheckpointContents& contents) const;
  // `observe` is called at SaveMoment::share_written. Throws a runtime error.
  void write_share(const CheckpointContents& contents, const SaveObserver& observe = {}) const;
  void mark_share(const CheckpointContents& contents, int rank, const std::string& failure) const;
  // How long rank 0 awaits the next mark, and a flag that stops the wait.
  struct ShareWait {
    std::chrono::seconds patience{600};
    const std::atomic<bool>* abandoned = nullptr;
  };
  // Returns once every rank but 0 has marked its share written; throws a runtime error naming the
  // first rank that failed (once every rank has marked, so that none still writes into the
  // directory), or the ranks that marked nothing within the patience of the mark before.
  void await_shares(const CheckpointContents& contents, const ShareWait& wait) const;
  // Completes the checkpoint, points `latest` at it, then keeps the newest keep_last checkpoints
  // up to it plus every multiple of keep_every (0: none) and the checkpoint of step `keep` (the
  // newest one known good, when the new one is not known so yet); checkpoints of later steps,
  // left by a run that was resumed from an earlier one, are not touched; what holds the new
  // checkpoint's name is replaced only if it is the same checkpoint, and else moved aside to
  // step_XXXXXXXX.replaced-N. `observe` is called at the other SaveMoments.
  std::filesystem::path finish(const CheckpointContents& contents, const SaveObserver& observe = {},
                               std::optional<int64_t> keep = std::nullopt) const;
  // The save of `step` given up: its temporary directory removed (and with give_up, a runtime
  // error thrown that says why, and that the earlier checkpoints are kept).
  void abandon(int64_t step) const;
  [[noreturn]] void give_up(int64_t step, const std::string& reason) const;

  // The checkpoints of the run, by step: newest first.
  std::vector<int64_t> saved_steps() const;

  // Moves the checkpoint of `step`, found bad, to step_XXXXXXXX.bad-N, where nothing resumes from
  // or prunes it, and returns that path; `latest`, where it named that checkpoint, then names
  // `instead`'s (none: `latest` is removed, and the newest checkpoint stands in for it).
  std::filesystem::path set_aside(int64_t step, std::optional<int64_t> instead) const;

  // Makes `latest` name the checkpoint of `step`.
  void point_latest_at(int64_t step) const;

  // The checkpoint `latest` names, or without `latest` the newest, if any.
  std::optional<std::filesystem::path> latest() const;

  // Where the checkpoint of `step` is, or would be.
  std::filesystem::path path_of(int64_t step) const;

  // The resume policy: loads the checkpoint `resume` names into the model and the optimizer and
  // returns its progress, or nothing for a fresh start. "" is a fresh start, refused where
  // checkpoints already are (its own would be pruned against them and could replace them);
  // "auto" is the newest checkpoint (none: a fresh start), and a damaged newest one is refused
  // with the newest intact one named; anything else is a checkpoint directory.
  std::optional<TrainingProgress> resume(const std::string& resume, Llama& model,
                                         Optimizer& optimizer, const Config& config) const;

 private:
  // Whether RUN_DIR/checkpoints is there; something else in its place is a UserError.
  bool exists() const;
  std::filesystem::path temporary_of(int64_t step) const;
  void prune(int64_t saved_step, int64_t keep_last, int64_t keep_every,
             std::optional<int64_t> keep) const;
  std::optional<std::string> latest_name() const;
  std::optional<std::filesystem::path> newest_intact_before(int64_t step) const;

  std::filesystem::path directory_;
};

// The verified weights file a path means: a .safetensors file itself (checked against its
// checkpoint's checksums when it is in one), a checkpoint directory's model.safetensors, or a run
// directory's newest checkpoint's. Nothing there, or a damaged checkpoint, is a UserError.
std::filesystem::path find_weights(const std::filesystem::path& path);

// The config saved with `weights`, which find_weights found for `source`: its checkpoint's
// config.yaml, or the one in `source` itself. Weights saved with none (a Hugging Face directory, a
// bare .safetensors file) are a UserError that asks for the config they were trained with.
std::filesystem::path saved_config_for(const std::filesystem::path& source,
                                       const std::filesystem::path& weights);

// The run directory whose checkpoint holds `weights` (RUN_DIR/checkpoints/step_X/...), if any.
std::optional<std::filesystem::path> run_directory_of(const std::filesystem::path& weights);

}  // namespace mltrain
