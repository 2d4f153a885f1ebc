#pragma once

#include <algorithm>
#include <cstdint>

#include "trainer/config/config.h"

namespace mltrain {

// When a run logs, evaluates, checkpoints and ends: the one owner of train.log_every, eval_every,
// ckpt_every, stop_at and max_steps. Steps are counted from 1: step s is the s-th optimizer step,
// and a checkpoint of step s holds the weights after it.
class RunSchedule {
 public:
  // For a run that starts after `steps_done` steps (0, or the resumed checkpoint's step).
  RunSchedule(const TrainConfig& train, int64_t steps_done)
      : train_(train),
        first_step_(steps_done + 1),
        last_step_(train.stop_at > 0 ? std::min(train.stop_at, train.max_steps) : train.max_steps) {
  }

  int64_t first_step() const { return first_step_; }
  // The step this run ends after: train.stop_at when it comes before train.max_steps.
  int64_t last_step() const { return last_step_; }
  int64_t max_steps() const { return train_.max_steps; }
  bool stops_early() const { return last_step_ < train_.max_steps; }

  bool keep_going(int64_t steps_done) const { return steps_done < last_step_; }
  // The first step of a run is logged too: it shows at once that training started.
  bool log_now(int64_t step) const {
    return step == first_step_ || step % train_.log_every == 0 || step == train_.max_steps;
  }
  bool evaluate_now(int64_t step) const {
    return step % train_.eval_every == 0 || step == train_.max_steps;
  }
  bool checkpoint_now(int64_t step) const {
    return step % train_.ckpt_every == 0 || step == last_step_;
  }

 private:
  TrainConfig train_;
  int64_t first_step_;
  int64_t last_step_;
};

}  // namespace mltrain
