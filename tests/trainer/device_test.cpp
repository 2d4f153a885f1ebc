#include "trainer/machine/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

// The datasheet figures, dense bf16 with fp32 accumulate, restated here in TFLOP/s.
TEST(PeakBf16Flops, L40AndL4AreDifferentParts) {
  EXPECT_DOUBLE_EQ(peak_bf16_flops_of("NVIDIA L40"), 181.05e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops_of("NVIDIA L4"), 121e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops_of("NVIDIA L40S"), 362.05e12);
}

TEST(PeakBf16Flops, NvlPartsAreBelowSxm) {
  const double h100_sxm = peak_bf16_flops_of("NVIDIA H100 80GB HBM3");
  const double h200_sxm = peak_bf16_flops_of("NVIDIA H200");
  EXPECT_DOUBLE_EQ(h100_sxm, 989.5e12);
  EXPECT_DOUBLE_EQ(h200_sxm, 989.5e12);
  EXPECT_GT(peak_bf16_flops_of("NVIDIA H100 NVL"), 0.0);
  EXPECT_LT(peak_bf16_flops_of("NVIDIA H100 NVL"), h100_sxm);
  EXPECT_GT(peak_bf16_flops_of("NVIDIA H200 NVL"), 0.0);
  EXPECT_LT(peak_bf16_flops_of("NVIDIA H200 NVL"), h200_sxm);
}

TEST(PeakBf16Flops, UnknownNameIsZero) {
  EXPECT_EQ(peak_bf16_flops_of("NVIDIA GeForce GTX 1080"), 0.0);
  EXPECT_EQ(peak_bf16_flops_of(""), 0.0);
}

// A longer name is another part (or a MIG slice of one), not the table's entry it starts with.
TEST(PeakBf16Flops, NameWithASuffixIsNotMatchedByItsPrefix) {
  ASSERT_GT(peak_bf16_flops_of("NVIDIA A10"), 0.0);
  EXPECT_EQ(peak_bf16_flops_of("NVIDIA A10G"), 0.0);
  ASSERT_GT(peak_bf16_flops_of("NVIDIA H200"), 0.0);
  EXPECT_EQ(peak_bf16_flops_of("NVIDIA H200 MIG 1g.18gb"), 0.0);
}

TEST(PeakBf16Flops, CpuHasNone) { EXPECT_EQ(peak_bf16_flops(c10::Device(c10::kCPU)), 0.0); }

TEST(ResolveDevice, CudaWithoutADeviceSaysWhyAndHowToUseTheCpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  try {
    resolve_device("cuda");
    FAIL() << "resolve_device(\"cuda\") returned without a CUDA device";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_CONTAINS(message, "no CUDA device is visible");
    EXPECT_CONTAINS(message, "no GPU");
    EXPECT_CONTAINS(message, "driver is too old for CUDA");
    EXPECT_CONTAINS(message, "--set train.device=cpu");
  }
}

}  // namespace
}  // namespace mltrain
