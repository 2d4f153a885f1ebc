#include "data/loader.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace mltrain {

at::Tensor gather_windows(const TokenWindows& windows, const std::vector<int64_t>& indices,
                          bool pin_memory) {
  const int64_t length = windows.window_length();
  at::Tensor tokens = at::empty({static_cast<int64_t>(indices.size()), length},
                                at::TensorOptions().dtype(at::kLong).pinned_memory(pin_memory));
  int64_t* data = tokens.data_ptr<int64_t>();
  for (size_t row = 0; row < indices.size(); ++row) {
    windows.read(indices[row], {data + row * length, static_cast<size_t>(length)});
  }
  return tokens;
}

at::Tensor gather_targets(const TokenWindows& windows, const std::vector<int64_t>& indices,
                          bool pin_memory) {
  const int64_t length = windows.window_length() - 1;
  at::Tensor targets = at::empty({static_cast<int64_t>(indices.size()), length},
                                 at::TensorOptions().dtype(at::kByte).pinned_memory(pin_memory));
  uint8_t* data = targets.data_ptr<uint8_t>();
  for (size_t row = 0; row < indices.size(); ++row)
    windows.read_targets(indices[row], {data + row * length, static_cast<size_t>(length)});
  return targets;
}

Loader::Loader(std::vector<const TokenWindows*> sources, BlendedSampler sampler, int64_t rank,
               int64_t start_sample, int64_t prefetch, bool pin_memory)
    : sources_(std::move(sources)),
      first_window_([this] {
        std::vector<int64_t> first{0};
        for (const TokenWindows* source : sources_)
          first.push_back(first.back() + source->num_windows());
        return first;
      }()),
      sampler_(std::move(sampler)),
      counting_sampler_(sampler_),
      rank_(rank),
      prefetch_(prefetch),
      pin_memory_(pin_memory),
      loss_masks_(std::any_of(sources_.begin(), sources_.end(),
                              [](const TokenWindows* source) { return source->has_loss_masks(); })),
      next_step_start_(start_sample),
      thread_([this] { produce(); }) {}

Loader::~Loader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Loader::produce() {
  try {
    while (true) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(
            lock, [this] { return stopping_ || static_cast<int64_t>(ready_.size()) < prefetch_; });
        if (stopping_) return;
      }
      if (loss_masks_ && next_micro_step_ == 0)
        step_targets_ = count_step_targets(next_step_start_);
      MicroBatch batch = gather(sampler_.windows(next_step_start_, next_micro_step_, rank_));
      if (++next_micro_step_ == sampler_.layout().grad_accum) {
        next_micro_step_ = 0;
        next_step_start_ += sampler_.layout().global_batch();
      }
      {
        std::lock_guard lock(mutex_);
        ready_.push_back(std::move(batch));
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
    changed_.notify_all();
  }
}

MicroBatch Loader::gather(const std::vector<BlendedSampler::Sample>& samples) const {
  const int64_t length = sources_.front()->window_length();
  MicroBatch batch;
  batch.tokens = at::empty({static_cast<int64_t>(samples.size()), length},
                           at::TensorOptions().dtype(at::kLong).pinned_memory(pin_memory_));
  int64_t* data = batch.tokens.data_ptr<int64_t>();
  for (size_t row = 0; row < samples.size(); ++row) {
    const BlendedSampler::Sample& sample = samples[row];
    sources_[sample.source]->read(sample.window,
                                  {data + row * length, static_cast<size_t>(length)});
    batch.windows.push_back(first_window_[sample.source] + sample.window);
  }
  if (!loss_masks_) return batch;
  batch.target_mask = at::empty({static_cast<int64_t>(samples.size()), length - 1},
                                at::TensorOptions().dtype(at::kByte).pinned_memory(pin_memory_));
  uint8_t* targets = batch.target_mask.data_ptr<uint8_t>();
  for (size_t row = 0; row < samples.size(); ++row) {
    sources_[samples[row].source]->read_targets(
        samples[row].window, {targets + row * (length - 1), static_cast<size_t>(length - 1)});
  }
  batch.step_targets = step_targets_;
  return batch;
}

// Each window's count was taken when the masks were opened: this reads no file.
int64_t Loader::count_step_targets(int64_t step_start) {
  const BatchLayout& layout = counting_sampler_.layout();
  int64_t count = 0;
  for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
    for (int64_t rank = 0; rank < layout.world_size; ++rank) {
      for (const BlendedSampler::Sample& sample :
           counting_sampler_.windows(step_start, micro, rank))
        count += sources_[sample.source]->targets_in_window(sample.window);
    }
  }
  return count;
}

MicroBatch Loader::next() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !ready_.empty() || error_; });
  waited_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (ready_.empty()) std::rethrow_exception(error_);
  MicroBatch batch = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace mltrain
