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

// train.tf32 sets cuBLAS's fp32 products to TF32 or full fp32, process-wide, through both of
// torch's flags alike: ATen's legacy reader throws where the two disagree.
TEST(ComputeSettings, Tf32FollowsTheKey) {
  TrainConfig train;
  ASSERT_TRUE(train.tf32) << "on by default";
  apply_compute_settings(train);
  EXPECT_TRUE(cuda_matmuls_in_tf32());
  EXPECT_TRUE(at::globalContext().allowTF32CuBLAS());
  train.tf32 = false;
  apply_compute_settings(train);
  EXPECT_FALSE(cuda_matmuls_in_tf32());
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
}

}  // namespace
}  // namespace mltrain
