// The blended order of several corpora: shares held within one sample at every prefix, each
// source read in its own permutation's order, and new weights that continue every source where it
// stopped.
#include "data/blended_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "data/split_mix.h"

namespace mltrain {
namespace {

const std::vector<int64_t> kWindows = {5000, 800, 300};  // the third repeats within the test

std::vector<BlendSource> three_sources(const std::vector<double>& weights) {
  std::vector<BlendSource> sources;
  for (size_t s = 0; s < kWindows.size(); ++s)
    sources.push_back({kWindows[s], weights[s], source_seed(9, "source " + std::to_string(s))});
  return sources;
}

BlendSegment from_the_start() { return {0, std::vector<int64_t>(kWindows.size(), 0)}; }

TEST(BlendedSampler, EverySourceStaysWithinOneSampleOfItsShareAtEveryPrefix) {
  const std::vector<double> shares = {0.7, 0.2, 0.1};
  BlendedSampler blend(three_sources({7, 2, 1}), {}, from_the_start());  // weights of any scale
  std::vector<int64_t> counts(3, 0);
  for (int64_t n = 0; n < 10000; ++n) {
    ++counts[blend.sample(n).source];
    for (size_t s = 0; s < 3; ++s) {
      ASSERT_LE(std::abs(static_cast<double>(counts[s]) - shares[s] * static_cast<double>(n + 1)),
                1.0)
          << "source " << s << " after " << n + 1 << " samples";
    }
  }
  EXPECT_EQ(blend.consumed(10000), counts);
}

// Random blends of 2 to 12 sources, with some paused: every count within 1 - 1 / (2k - 2) of its
// share at every prefix, k the sources of positive weight (Tijdeman's bound, below one sample;
// the largest shortfall alone passes 1.1 here).
TEST(BlendedSampler, RandomBlendsStayWithinTijdemansBoundOfEveryShare) {
  SplitMix64 random(21);
  for (int64_t trial = 0; trial < 120; ++trial) {
    const auto count = static_cast<size_t>(2 + trial % 11);
    std::vector<BlendSource> sources;
    double total = 0.0;
    int64_t weighted = 0;
    for (size_t s = 0; s < count; ++s) {
      // One source in eight paused (weight 0), but never the first.
      const double weight = s > 0 && random.below(8) == 0
                                ? 0.0
                                : 0.01 + static_cast<double>(random.below(1000)) / 1000.0;
      sources.push_back({100, weight, s});
      total += weight;
      weighted += weight > 0 ? 1 : 0;
    }
    const double bound = weighted > 1 ? 1.0 - 1.0 / static_cast<double>(2 * weighted - 2) : 0.0;
    BlendedSampler blend(sources, {}, {0, std::vector<int64_t>(count, 0)});
    std::vector<int64_t> counts(count, 0);
    double worst = 0.0;
    for (int64_t n = 0; n < 2000; ++n) {
      ++counts[blend.sample(n).source];
      for (size_t s = 0; s < count; ++s) {
        worst = std::max(worst, std::abs(static_cast<double>(counts[s]) -
                                         sources[s].weight / total * static_cast<double>(n + 1)));
      }
    }
    EXPECT_LE(worst, bound + 1e-9) << count << " sources, trial " << trial;
  }
}

// Each source's k-th sample is window k of the source's own Sampler, epoch after epoch.
TEST(BlendedSampler, EachSourceReadsItsOwnPermutationInOrder) {
  const std::vector<BlendSource> sources = three_sources({7, 2, 1});
  BlendedSampler blend(sources, {}, from_the_start());
  std::vector<Sampler> own;
  for (const BlendSource& source : sources) own.emplace_back(source.windows, source.seed);
  std::vector<int64_t> counts(3, 0);
  for (int64_t n = 0; n < 10000; ++n) {
    const BlendedSampler::Sample sample = blend.sample(n);
    ASSERT_EQ(sample.window, own[sample.source].window_of_sample(counts[sample.source]++))
        << "sample " << n;
  }
  EXPECT_GT(counts[2], kWindows[2]) << "the smallest source went past an epoch";
}

// One source of weight 1 with data.seed is the one-corpus order of earlier runs.
TEST(BlendedSampler, OneUnnamedSourceIsTheOneCorpusOrder) {
  BlendedSampler blend({{777, 1.0, source_seed(11, "")}}, {}, {0, {0}});
  Sampler one_corpus(777, 11);
  for (int64_t n = 0; n < 2000; ++n) {
    const BlendedSampler::Sample sample = blend.sample(n);
    ASSERT_EQ(sample.source, 0);
    ASSERT_EQ(sample.window, one_corpus.window_of_sample(n)) << "sample " << n;
  }
}

// New weights from sample 3000 on: a segment that starts there with each source's count. Every
// source goes on with the next window of its permutation (none read twice, none skipped), and the
// new shares hold within one sample from the segment's start.
TEST(BlendedSampler, NewWeightsContinueEverySourceWhereItStopped) {
  const std::vector<BlendSource> before = three_sources({7, 2, 1});
  BlendedSampler first(before, {}, from_the_start());
  std::vector<std::vector<int64_t>> read(3);
  for (int64_t n = 0; n < 3000; ++n) {
    const BlendedSampler::Sample sample = first.sample(n);
    read[sample.source].push_back(sample.window);
  }
  const std::vector<double> shares = {0.2, 0.2, 0.6};
  BlendedSampler second(three_sources({2, 2, 6}), {}, {3000, first.consumed(3000)});
  std::vector<int64_t> since(3, 0);
  for (int64_t n = 3000; n < 6000; ++n) {
    const BlendedSampler::Sample sample = second.sample(n);
    read[sample.source].push_back(sample.window);
    ++since[sample.source];
    for (size_t s = 0; s < 3; ++s)
      ASSERT_LE(std::abs(static_cast<double>(since[s]) - shares[s] * static_cast<double>(n - 2999)),
                1.0);
  }
  for (size_t s = 0; s < 3; ++s) {
    Sampler own(before[s].windows, before[s].seed);
    for (size_t k = 0; k < read[s].size(); ++k)
      ASSERT_EQ(read[s][k], own.window_of_sample(static_cast<int64_t>(k)))
          << "source " << s << ", its sample " << k;
  }
}

// A step's samples are the same whatever the world size (the layout slices them), and a sampler
// that starts mid-run (a resumed one) gives what the one that walked there gives.
TEST(BlendedSampler, AnyWorldSizeAndAResumedSamplerReadTheSameSamples) {
  const auto step_samples = [](BlendedSampler& blend, int64_t step_start) {
    std::vector<std::pair<int, int64_t>> all;
    const BatchLayout& layout = blend.layout();
    for (int64_t micro = 0; micro < layout.grad_accum; ++micro)
      for (int64_t rank = 0; rank < layout.world_size; ++rank)
        for (const BlendedSampler::Sample& sample : blend.windows(step_start, micro, rank))
          all.emplace_back(sample.source, sample.window);
    std::sort(all.begin(), all.end());
    return all;
  };
  BlendedSampler one(three_sources({7, 2, 1}), {.micro_batch = 6, .grad_accum = 2, .world_size = 1},
                     from_the_start());
  BlendedSampler two(three_sources({7, 2, 1}), {.micro_batch = 3, .grad_accum = 2, .world_size = 2},
                     from_the_start());
  BlendedSampler three(three_sources({7, 2, 1}),
                       {.micro_batch = 2, .grad_accum = 2, .world_size = 3}, from_the_start());
  for (int64_t step = 0; step < 200; ++step) {
    const auto expected = step_samples(one, step * 12);
    ASSERT_EQ(step_samples(two, step * 12), expected) << "step " << step;
    ASSERT_EQ(step_samples(three, step * 12), expected) << "step " << step;
  }
  BlendedSampler resumed(three_sources({7, 2, 1}),
                         {.micro_batch = 6, .grad_accum = 2, .world_size = 1}, from_the_start());
  BlendedSampler walked(three_sources({7, 2, 1}),
                        {.micro_batch = 6, .grad_accum = 2, .world_size = 1}, from_the_start());
  for (int64_t step = 0; step < 150; ++step) step_samples(walked, step * 12);
  for (int64_t step = 150; step < 200; ++step)
    EXPECT_EQ(step_samples(resumed, step * 12), step_samples(walked, step * 12)) << "step " << step;
}

}  // namespace
}  // namespace mltrain
