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

// The order in which one corpus's windows are read, as a function of the number of its samples
// consumed. Each epoch is one permutation of all windows, seeded by (seed, epoch) with a generator
// and shuffle of our own (std::shuffle differs between standard libraries), so the order is the
// same on every machine. The run's order over its corpora is blended_sampler.h's.
class Sampler {
 public:
  Sampler(int64_t num_windows, uint64_t seed);

  // The window that the corpus's sample-th sample reads.
  int64_t window_of_sample(int64_t sample);

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  int64_t num_windows_;
  uint64_t seed_;
  std::map<int64_t, std::vector<int64_t>> permutations_;  // at most the two epochs a step spans
};

// The first of the samples that `rank` reads in `micro_step` of the optimizer step starting at
// sample `step_start`: micro-step m of rank r takes the slice (m x world_size + r) of the step's
// samples [step_start, step_start + global_batch), so any world size reads the same samples.
inline int64_t first_sample_of(const BatchLayout& layout, int64_t step_start, int64_t micro_step,
                               int64_t rank) {
  return step_start + (micro_step * layout.world_size + rank) * layout.micro_batch;
}

// Validation reads its windows in file order, no shuffle: global batch b holds windows
// [b x micro_batch x world_size, ...), rank r the r-th slice of micro_batch of them; the last
// batch may be short, or empty on some ranks. Every window is read once per evaluation.
int64_t validation_batches(int64_t num_windows, const BatchLayout& layout, int64_t eval_batches);
std::vector<int64_t> validation_windows(int64_t num_windows, const BatchLayout& layout,
                                        int64_t batch, int64_t rank);

}  // namespace mltrain
