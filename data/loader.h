#pragma once

#include <ATen/Tensor.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "data/blended_sampler.h"
#include "data/token_windows.h"

namespace mltrain {

// One micro-batch of windows: tokens [micro_batch, seq_len + 1] (int64); the model reads
// tokens[:, :-1] and predicts tokens[:, 1:]. `windows` are its rows' windows, numbered through the
// sources in their order (source 1's first window follows source 0's last).
struct MicroBatch {
  at::Tensor tokens;
  std::vector<int64_t> windows;
  // With loss masks (a source's TokenWindows::has_loss_masks): whether each target counts,
  // [micro_batch, seq_len] uint8 (pinned with pin_memory), and the targets that count in the
  // whole optimizer step, over every micro-step of every rank: the count the step's loss is the
  // mean over, which every rank knows without a collective. Undefined and 0 without masks.
  at::Tensor target_mask;
  int64_t step_targets = 0;
};

// Gathers this rank's micro-batches of the blended sources on a background thread, in training
// order from `start_sample` on, keeping `prefetch` of them ready. With pin_memory (CUDA runs) the
// buffers are page-locked so the copy to the device can be asynchronous. An error on the thread is
// rethrown by next().
class Loader {
 public:
  Loader(std::vector<const TokenWindows*> sources, BlendedSampler sampler, int64_t rank,
         int64_t start_sample, int64_t prefetch, bool pin_memory);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  MicroBatch next();

  // Seconds next() spent waiting for the thread: loader time that shows up in training steps.
  double waited_seconds() const { return waited_seconds_; }

 private:
  void produce();

  MicroBatch gather(const std::vector<BlendedSampler::Sample>& samples) const;
  // The targets that count in the optimizer step starting at sample step_start, on every rank.
  int64_t count_step_targets(int64_t step_start);

  std::vector<const TokenWindows*> sources_;
  std::vector<int64_t> first_window_;  // each source's first window in the numbering of `windows`
  BlendedSampler sampler_;
  // A copy that walks every rank's samples to count each step's targets, so that sampler_ only
  // ever moves forward (going back replays a blend from its segment's start).
  BlendedSampler counting_sampler_;
  int64_t rank_;
  int64_t prefetch_;
  bool pin_memory_;
  bool loss_masks_;
  int64_t next_step_start_;
  int64_t step_targets_ = 0;  // of the step being gathered
  int64_t next_micro_step_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<MicroBatch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  double waited_seconds_ = 0.0;
  std::thread thread_;  // last: started once everything above is initialised
};

// Reads the given windows into a [count, seq_len + 1] int64 tensor.
at::Tensor gather_windows(const TokenWindows& windows, const std::vector<int64_t>& indices,
                          bool pin_memory = false);
// Reads whether each of their targets counts into a [count, seq_len] uint8 tensor
// (TokenWindows::read_targets).
at::Tensor gather_targets(const TokenWindows& windows, const std::vector<int64_t>& indices,
                          bool pin_memory = false);

}  // namespace mltrain
