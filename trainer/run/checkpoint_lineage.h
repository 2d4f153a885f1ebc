#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

namespace mltrain {

// Which of a run's checkpoints are good, and where a rollback goes. One applied update with a
// finite loss can wreck the weights (a learning rate far too high): the steps after it are then
// skipped, and a checkpoint that holds those weights gives only skipped steps. The run saves no
// checkpoint while steps are being skipped (its weights would be the suspect ones), and:
// - a checkpoint is good once confirmed: a step trained from its weights was applied. Pruning
//   keeps the newest confirmed one, whatever train.keep_last says, so that a checkpoint saved
//   just after a destructive update cannot prune the last good one; the last good checkpoint a
//   run names is the newest confirmed one;
// - a rollback goes to the newest checkpoint of the weights before the skipped steps (at or before
//   the last applied step) whose step it has not gone back to already: the trouble may have been
//   a few samples, which the rollback leaves out. A rollback that comes back to the same trouble
//   goes further back each time, once to each step, so a run rolls back at most once per step
//   that it holds a checkpoint of, and stops when none is left;
// - a checkpoint gone back to whose weights then gave only skipped steps (none applied since),
//   and that no applied step ever confirmed, is bad: it is set aside. So, when the run stops,
//   is a checkpoint saved since its last rollback that no applied step confirmed: it holds the
//   weights the skipped steps came from.
// Steps only: the checkpoint store knows where they are. Every rank keeps one, and decides alike
// from the same list of checkpoints (rank 0's).
class CheckpointLineage {
 public:
  // For a run that starts from the checkpoint of `resumed_step`, or afresh.
  explicit CheckpointLineage(std::optional<int64_t> resumed_step);

  // The update of `step` was applied (the host read that it was not skipped): it confirms the
  // checkpoints its weights came from.
  void applied(int64_t step);
  // A checkpoint of `step` was saved: it holds the weights of the last applied step.
  void saved(int64_t step);

  // The newest checkpoint confirmed good, if any: what pruning must keep, and the last good one.
  std::optional<int64_t> confirmed() const;

  struct Rollback {
    std::vector<int64_t> bad;       // checkpoints to set aside
    std::optional<int64_t> target;  // none: nothing is left to go back to
  };
  // Skipped steps made the run roll back. `available`: the steps of the checkpoints at hand now.
  // Once the bad ones are set aside and the target loaded, the run goes on from the target (or
  // stops, without one: then the checkpoints saved since the last rollback that no step
  // confirmed are bad too).
  Rollback roll_back(const std::vector<int64_t>& available);

  // The newest confirmed checkpoint that is still `available`, if any.
  std::optional<int64_t> newest_good(const std::vector<int64_t>& available) const;

  // The steps rolled back to, in the order the rollbacks went.
  const std::vector<int64_t>& tried() const { return tried_; }

 private:
  bool was_tried(int64_t step) const;

  int64_t last_applied_;         // the step whose update made the current weights; 0: none yet
  std::set<int64_t> segment_;    // checkpoints since the run started or last rolled back
  std::set<int64_t> confirmed_;  // checkpoints a step applied after them confirms
  std::vector<int64_t> tried_;   // steps rolled back to
  std::optional<int64_t> rolled_back_to_;  // with no step applied since
};

}  // namespace mltrain
