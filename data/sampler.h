#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace mltrain {

// How a global batch is split: each of world_size ranks runs grad_accum micro-steps of
// micro_batch windows.
struct BatchLayout {
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  int64_t world_size = 1;
  int64_t global_batch() const { return micro_batch * grad_accum * world_size; }
};

// The order in which training reads windows, as a function of the number of samples consumed.
// Each epoch is one permutation of all windows, seeded by (seed, epoch) with a generator and
// shuffle of our own (std::shuffle differs between standard libraries), so the order is the same
// on every machine. An optimizer step that starts at sample c reads samples [c, c + global_batch):
// the same windows whatever the world size, so the only data state to checkpoint is c.
class Sampler {
 public:
  Sampler(int64_t num_windows, uint64_t seed, BatchLayout layout);

  // The windows that `rank` reads in `micro_step` of the optimizer step starting at sample
  // `step_start`. Micro-step m of rank r takes the slice (m x world_size + r) of the step's
  // samples.
  std::vector<int64_t> windows(int64_t step_start, int64_t micro_step, int64_t rank);

  // The window that the run's sample-th sample reads.
  int64_t window_of_sample(int64_t sample);

  const BatchLayout& layout() const { return layout_; }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  int64_t num_windows_;
  uint64_t seed_;
  BatchLayout layout_;
  std::map<int64_t, std::vector<int64_t>> permutations_;  // at most the two epochs a step spans
};

// Validation reads its windows in file order, no shuffle: global batch b holds windows
// [b x micro_batch x world_size, ...), rank r the r-th slice of micro_batch of them; the last
// batch may be short, or empty on some ranks. Every window is read once per evaluation.
int64_t validation_batches(int64_t num_windows, const BatchLayout& layout, int64_t eval_batches);
std::vector<int64_t> validation_windows(int64_t num_windows, const BatchLayout& layout,
                                        int64_t batch, int64_t rank);

}  // namespace mltrain
