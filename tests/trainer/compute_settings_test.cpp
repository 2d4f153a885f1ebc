#include "trainer/machine/compute_settings.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <limits>

namespace mltrain {
namespace {

TEST(ComputeSettings, FlushesDenormalsOnEveryThreadThatComputes) {
  at::set_num_threads(2);
  // Before: the product of two normal floats can be denormal (IEEE gradual underflow).
  const float tiny = std::numeric_limits<float>::min();  // 2^-126
  const at::Tensor normal = at::full({1 << 16}, tiny);
  at::globalContext().setFlushDenormal(false);
  EXPECT_FALSE(flushes_denormals());
  EXPECT_GT((normal * 0.25f).ne(0).sum().item<int64_t>(), 0) << "denormal results before";

  TrainConfig train;
  train.threads = 2;
  apply_compute_settings(train);
  EXPECT_TRUE(flushes_denormals());
  EXPECT_EQ(at::get_num_threads(), 2);
  // A product large enough for ATen to split over its threads: no worker may keep a denormal.
  EXPECT_EQ((normal * 0.25f).ne(0).sum().item<int64_t>(), 0);
  // DAZ: denormal inputs read as zero.
  at::globalContext().setFlushDenormal(false);
  const at::Tensor denormal = normal * 0.25f;
  apply_compute_settings(train);
  EXPECT_EQ((denormal * 2.0f).ne(0).sum().item<int64_t>(), 0);
}

}  // namespace
}  // namespace mltrain
