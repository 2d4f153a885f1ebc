#include "data/blended_sampler.h"

#include <cmath>
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
  int64_t weighted = 0;
  for (const BlendSource& source : sources) {
    orders_.emplace_back(source.windows, source.seed);
    shares_.push_back(source.weight / total);
    weighted += source.weight > 0 ? 1 : 0;
  }
  delta_ = weighted > 1 ? 1.0 / static_cast<double>(2 * weighted - 2) : 0.0;
  rewind();
}

void BlendedSampler::rewind() {
  cursor_ = segment_.start;
  counts_ = segment_.consumed;
}

int BlendedSampler::choose_source() const {
  const auto n = static_cast<double>(cursor_ - segment_.start + 1);
  // Tijdeman's rule: among the sources whose shortfall has reached delta, the one whose next sample
  // falls due first. Exact arithmetic always finds one; rounding that left none would fall back to
  // the largest shortfall.
  int chosen = -1;
  double earliest = 0.0;
  int largest = 0;
  double largest_shortfall = -INFINITY;
  for (size_t s = 0; s < shares_.size(); ++s) {
    if (shares_[s] == 0) continue;
    const auto given = static_cast<double>(counts_[s] - segment_.consumed[s]);
    const double shortfall = shares_[s] * n - given;
    if (shortfall > largest_shortfall) {
      largest_shortfall = shortfall;
      largest = static_cast<int>(s);
    }
    if (shortfall < delta_ - 1e-9) continue;
    const double due = (given + 1 - delta_) / shares_[s];
    if (chosen < 0 || due < earliest) {
      earliest = due;
      chosen = static_cast<int>(s);
    }
  }
  return chosen >= 0 ? chosen : largest;
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
