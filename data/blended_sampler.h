#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sampler.h"

namespace mltrain {

// One corpus of a blend: its training windows, its weight (any scale; the blend normalises) and
// the seed of its own per-epoch permutation.
struct BlendSource {
  int64_t windows = 0;
  double weight = 1.0;
  uint64_t seed = 0;
};

// The seed of a named source's permutation under data.seed: the name's hash mixed in, so that a
// source keeps its order when others are added, removed or reordered. The unnamed source of the
// one-corpus form (data.train) keeps data.seed itself, and with it the order of earlier runs.
uint64_t source_seed(uint64_t seed, const std::string& name);

// Where the current weights began: the global sample from which they apply, and how many samples
// each source had given before it.
struct BlendSegment {
  int64_t start = 0;
  std::vector<int64_t> consumed;  // per source
};

// The order in which a blend of corpora is read, as a function of the samples consumed (as
// Sampler is for one corpus). Sample j of the segment (j = 1, 2, ...) goes by Tijdeman's rule for
// the chairman assignment problem: among the k weighted sources whose shortfall, share x j - (its
// samples so far in the segment), is at least delta = 1 / (2k - 2), the one whose next sample
// falls due first, at (its samples + 1 - delta) / share; the first on a tie. Every source's count
// then stays within 1 - delta (less than one sample) of its share at every prefix, however many
// sources there are (the largest shortfall alone, as Megatron's blend index takes, passes one
// sample from four sources on). A source's k-th sample reads window
// k of its own seeded per-epoch permutation. Resumed with other weights, a new segment starts
// where the run stopped, so that each source goes on from its own count: within a source's epoch
// no window is read twice and none is skipped. The layout slices a step's samples over the
// micro-steps and ranks as Sampler does, so any world size reads the same samples.
class BlendedSampler {
 public:
  BlendedSampler(std::vector<BlendSource> sources, BatchLayout layout, BlendSegment segment);

  struct Sample {
    int source = 0;
    int64_t window = 0;  // in the source's windows
  };

  // Global sample n: sequential calls cost O(sources) each; going back replays from the
  // segment's start.
  Sample sample(int64_t n);

  // The samples that `rank` reads in `micro_step` of the optimizer step starting at sample
  // `step_start`, as Sampler::windows slices them.
  std::vector<Sample> windows(int64_t step_start, int64_t micro_step, int64_t rank);

  // Each source's samples among samples [0, n), n at least the segment's start.
  std::vector<int64_t> consumed(int64_t n);

  const BatchLayout& layout() const { return layout_; }
  size_t num_sources() const { return orders_.size(); }

 private:
  int choose_source() const;   // for sample cursor_
  void advance_to(int64_t n);  // assigns the samples before n
  void rewind();

  std::vector<Sampler> orders_;  // each source's permutations
  std::vector<double> shares_;   // the weights, normalised to sum 1
  double delta_ = 0.0;           // Tijdeman's 1 / (2k - 2), k the sources of positive weight
  BatchLayout layout_;
  BlendSegment segment_;
  int64_t cursor_ = 0;           // the next sample to assign
  std::vector<int64_t> counts_;  // each source's samples among [0, cursor_)
};

}  // namespace mltrain
