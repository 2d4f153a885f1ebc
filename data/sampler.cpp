#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "data/split_mix.h"

namespace mltrain {

Sampler::Sampler(int64_t num_windows, uint64_t seed) : num_windows_(num_windows), seed_(seed) {}

const std::vector<int64_t>& Sampler::permutation(int64_t epoch) {
  auto found = permutations_.find(epoch);
  if (found != permutations_.end()) return found->second;
  if (permutations_.size() == 2) permutations_.erase(permutations_.begin());
  std::vector<int64_t> order(num_windows_);
  std::iota(order.begin(), order.end(), 0);
  // The epoch's seed is a hash of (seed, epoch), so neighbouring epochs are unrelated.
  SplitMix64 generator(SplitMix64(seed_ ^ (0xD1B54A32D192ED03ull * (epoch + 1))).next());
  generator.shuffle(order);
  return permutations_.emplace(epoch, std::move(order)).first->second;
}

int64_t Sampler::window_of_sample(int64_t sample) {
  return permutation(sample / num_windows_)[sample % num_windows_];
}

int64_t validation_batches(int64_t num_windows, const BatchLayout& layout, int64_t eval_batches) {
  const int64_t per_batch = layout.micro_batch * layout.world_size;
  const int64_t all = (num_windows + per_batch - 1) / per_batch;
  return eval_batches > 0 ? std::min(eval_batches, all) : all;
}

std::vector<int64_t> validation_windows(int64_t num_windows, const BatchLayout& layout,
                                        int64_t batch, int64_t rank) {
  const int64_t first = (batch * layout.world_size + rank) * layout.micro_batch;
  const int64_t last = std::min(first + layout.micro_batch, num_windows);
  std::vector<int64_t> result;
  for (int64_t window = first; window < last; ++window) result.push_back(window);
  return result;
}

}  // namespace mltrain
