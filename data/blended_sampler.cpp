#include "data/blended_sampler.h"

#include <stdexcept>
#include <utility>

#include "data/split_mix.h"

namespace mltrain {

uint64_t source_seed(uint64_t seed, const std::string& name) {
  if (name.empty()) return seed;
  uint64_t hash = 0xCBF29CE484222325ull;  // FNV-1a, fixed by its definition
  for (const unsigned char c : name) hash = (hash ^ c) * 0x100000001B3ull;
  return SplitMix64(seed ^ hash).next();
}

BlendedSampler::BlendedSampler(std::vector<BlendSource> sources, BatchLayout layout,
                               BlendSegment segment)
    : layout_(layout), segment_(std::move(segment)) {
  if (sources.empty() || segment_.consumed.size() != sources.size())
    throw std::invalid_argument("a blend needs its sources and each one's count at its start");
  double total = 0.0;
  for (const BlendSource& source : sources) total += source.weight;
  if (!(total > 0)) throw std::invalid_argument("a blend needs a positive weight");
  for (const BlendSource& source : sources) {
    orders_.emplace_back(source.windows, source.seed);
    shares_.push_back(source.weight / total);
  }
  rewind();
}

void BlendedSampler::rewind() {
  cursor_ = segment_.start;
  counts_ = segment_.consumed;
}

int BlendedSampler::choose_source() const {
  const auto since = static_cast<double>(cursor_ - segment_.start + 1);
  int chosen = 0;
  double largest = -1.0;
  for (size_t s = 0; s < shares_.size(); ++s) {
    const double shortfall =
        shares_[s] * since - static_cast<double>(counts_[s] - segment_.consumed[s]);
    if (shortfall > largest) {
      largest = shortfall;
      chosen = static_cast<int>(s);
    }
  }
  return chosen;
}

void BlendedSampler::advance_to(int64_t n) {
  if (n < segment_.start) throw std::out_of_range("a sample before the blend's segment");
  if (n < cursor_) rewind();
  if (orders_.size() == 1) {  // one source takes every sample: no need to replay them
    counts_[0] += n - cursor_;
    cursor_ = n;
  }
  for (; cursor_ < n; ++cursor_) ++counts_[choose_source()];
}

BlendedSampler::Sample BlendedSampler::sample(int64_t n) {
  advance_to(n);
  const int source = choose_source();
  const Sample result{source, orders_[source].window_of_sample(counts_[source])};
  ++counts_[source];
  ++cursor_;
  return result;
}

std::vector<BlendedSampler::Sample> BlendedSampler::windows(int64_t step_start, int64_t micro_step,
                                                            int64_t rank) {
  const int64_t first = first_sample_of(layout_, step_start, micro_step, rank);
  std::vector<Sample> result;
  result.reserve(layout_.micro_batch);
  for (int64_t i = 0; i < layout_.micro_batch; ++i) result.push_back(sample(first + i));
  return result;
}

std::vector<int64_t> BlendedSampler::consumed(int64_t n) {
  advance_to(n);
  return counts_;
}

}  // namespace mltrain
