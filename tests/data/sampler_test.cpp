#include "data/sampler.h"

#include "data/blended_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace mltrain {
namespace {

// The run's order over one corpus of `n` windows: a blend of one source, as data.train gives.
BlendedSampler one_corpus(int64_t n, uint64_t seed, BatchLayout layout) {
  return BlendedSampler({{n, 1.0, seed}}, layout, {0, {0}});
}

// Every window a whole optimizer step reads, over all ranks and micro-steps.
std::vector<int64_t> step_windows(BlendedSampler& sampler, int64_t step_start) {
  std::vector<int64_t> all;
  const BatchLayout& layout = sampler.layout();
  for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
    for (int64_t rank = 0; rank < layout.world_size; ++rank) {
      const auto part = sampler.windows(step_start, micro, rank);
      EXPECT_EQ(static_cast<int64_t>(part.size()), layout.micro_batch);
      for (const BlendedSampler::Sample& sample : part) all.push_back(sample.window);
    }
  }
  return all;
}

TEST(Sampler, EachEpochReadsEveryWindowExactlyOnce) {
  const int64_t n = 1000;
  BlendedSampler sampler = one_corpus(n, 7, {.micro_batch = 3, .grad_accum = 2, .world_size = 4});
  std::vector<int64_t> read;
  for (int64_t start = 0; start < 2 * n; start += 24) {
    const auto step = step_windows(sampler, start);
    read.insert(read.end(), step.begin(), step.end());
  }
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> epoch_windows(read.begin() + epoch * n, read.begin() + (epoch + 1) * n);
    const std::vector<int64_t> unshuffled = epoch_windows;
    std::sort(epoch_windows.begin(), epoch_windows.end());
    std::vector<int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(epoch_windows, all) << "epoch " << epoch;
    EXPECT_NE(unshuffled, all) << "the order is shuffled";
  }
  EXPECT_FALSE(std::equal(read.begin(), read.begin() + n, read.begin() + n)) << "epochs differ";
}

TEST(Sampler, AStepReadsTheSameWindowsOnAnyWorldSize) {
  const int64_t n = 5000;
  BlendedSampler one = one_corpus(n, 3, {.micro_batch = 8, .grad_accum = 2, .world_size = 1});
  BlendedSampler two = one_corpus(n, 3, {.micro_batch = 4, .grad_accum = 2, .world_size = 2});
  BlendedSampler four = one_corpus(n, 3, {.micro_batch = 2, .grad_accum = 2, .world_size = 4});
  for (int64_t start :
       {int64_t{0}, int64_t{16}, int64_t{4992}, int64_t{16 * 400}}) {  // 4992: spans epochs
    auto a = step_windows(one, start), b = step_windows(two, start), c = step_windows(four, start);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::sort(c.begin(), c.end());
    EXPECT_EQ(a, b) << "step starting at sample " << start;
    EXPECT_EQ(a, c) << "step starting at sample " << start;
  }
}

TEST(Sampler, ResumingFromACountContinuesTheSameSequence) {
  const BatchLayout layout{.micro_batch = 4, .grad_accum = 3, .world_size = 2};
  BlendedSampler unbroken = one_corpus(777, 11, layout);
  std::vector<std::vector<int64_t>> expected;
  for (int64_t start = 0; start < 100 * 24; start += 24)
    expected.push_back(step_windows(unbroken, start));
  BlendedSampler resumed = one_corpus(777, 11, layout);  // a new process that knows the count
  for (int64_t step = 37; step < 100; ++step) {
    EXPECT_EQ(step_windows(resumed, step * 24), expected[step]) << "step " << step;
  }
}

TEST(Sampler, SeedsGiveDifferentOrders) {
  Sampler a(1000, 1), b(1000, 2);
  int64_t same = 0;
  for (int64_t i = 0; i < 1000; ++i) same += a.window_of_sample(i) == b.window_of_sample(i);
  EXPECT_LT(same, 20);
}

TEST(ValidationOrder, EveryWindowOnceInFileOrderAcrossRanks) {
  const int64_t n = 103;
  const BatchLayout layout{.micro_batch = 5, .grad_accum = 4, .world_size = 3};
  const int64_t batches = validation_batches(n, layout, 0);
  EXPECT_EQ(batches, 7);  // ceil(103 / 15)
  std::vector<int64_t> read;
  for (int64_t batch = 0; batch < batches; ++batch) {
    for (int64_t rank = 0; rank < 3; ++rank) {
      const auto part = validation_windows(n, layout, batch, rank);
      read.insert(read.end(), part.begin(), part.end());
    }
  }
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(read, all);
  EXPECT_EQ(validation_batches(n, layout, 3), 3);
  EXPECT_EQ(validation_batches(n, layout, 50), 7);
}

}  // namespace
}  // namespace mltrain
