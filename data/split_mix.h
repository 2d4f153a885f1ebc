#pragma once

#include <cstdint>
#include <utility>

namespace mltrain {

// SplitMix64: a small, well-mixed generator whose output is fixed by its definition, unlike the
// standard library's distributions and shuffle, so data orders are the same on every machine.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound) without modulo bias (Lemire's multiply-and-reject).
  uint64_t below(uint64_t bound) {
    unsigned __int128 product = static_cast<unsigned __int128>(next()) * bound;
    if (static_cast<uint64_t>(product) < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (static_cast<uint64_t>(product) < threshold) {
        product = static_cast<unsigned __int128>(next()) * bound;
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

  // Fisher-Yates shuffle of a random-access range.
  template <class Range>
  void shuffle(Range& range) {
    for (size_t i = range.size(); i > 1; --i) std::swap(range[i - 1], range[below(i)]);
  }

 private:
  uint64_t state_;
};

}  // namespace mltrain
