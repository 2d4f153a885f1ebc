#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "trainer/checkpoint/save_moment.h"

namespace mltrain {

// The seam through which tests make failures happen on purpose: what a crash, a full disk, a
// diverging run or a dead rank leave behind. A default-constructed TrainingHooks does nothing,
// and the shipped binaries never set one.
struct TrainingHooks {
  // As step `step` (counted from 1) takes a micro-batch, with the indices of the training windows
  // that this rank reads in it.
  std::function<void(int64_t step, int rank, const std::vector<int64_t>& windows)> read_windows;
  // After step `step` (counted from 1) has averaged its gradients, before they are clipped, with
  // the averaged gradients the update will read: every parameter's, or under ZeRO-1 this rank's
  // parts of them.
  std::function<void(int64_t step, int rank, const std::vector<at::Tensor>& gradients)>
      after_gradients;
  // After step `step`'s loss is averaged over the ranks, with that loss (a double scalar on the
  // device), which the hook may change in place: a loss spike.
  std::function<void(int64_t step, const at::Tensor& loss)> after_loss;
  // At each moment of a checkpoint save (save_moment.h), on the thread that writes it: a hook that
  // throws fails the save, one that kills the process leaves the run directory as that moment has
  // it.
  SaveObserver during_checkpoint_write;
};

}  // namespace mltrain
