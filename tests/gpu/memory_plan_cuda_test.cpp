// The memory plan's activation counts on CUDA (trainer/run/memory_plan.h) against what the CUDA
// caching allocator holds after one micro-batch's forward: the ATen layers (what train.kernels:
// auto takes on CUDA) and mltrain's CUDA kernels (fused_cuda), in fp32 and under bf16 autocast,
// with and without activation checkpointing. The CPU's counterpart, which holds its paths to 3%,
// is tests/trainer/memory_plan_test.cpp; the CUDA counts were written from what each layer saves,
// and this is their first measurement.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <optional>

#include "model/kernels/cuda_kernels.h"
#include "tests/support/activation_memory.h"
#include "trainer/run/memory_plan.h"

namespace mltrain {
namespace {

TEST(MemoryPlanOnCuda, ActivationsMatchWhatTheGraphOfAMicroBatchHolds) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  ASSERT_TRUE(cuda_kernels_built());
  Config config;
  config.model = testing::small_base();
  config.data.seq_len = 128;
  const int64_t batch = 8;
  // The first matrix product on a stream takes cuBLAS's workspace (several MiB) from the caching
  // allocator, for the process's life: taken here, before anything is measured.
  testing::measured_activations(config.model, Kernels::aten, 1, 16, false, false, std::nullopt,
                                c10::Device(at::kCUDA));
  for (const Kernels kernels : {Kernels::aten, Kernels::fused_cuda}) {
    config.train.kernels = kernels == Kernels::aten ? "aten" : "fused_cuda";
    for (const bool bf16 : {false, true}) {
      const ComputePath path = compute_path(
          config, {.ranks = 1, .cuda = true, .bf16 = bf16, .device_memory = std::nullopt});
      for (const bool checkpointing : {false, true}) {
        const int64_t measured =
            testing::measured_activations(config.model, kernels, batch, config.data.seq_len, bf16,
                                          checkpointing, std::nullopt, c10::Device(at::kCUDA));
        // Held after forward besides the activations: autocast's casts of the weights.
        const double planned =
            activation_bytes(config.model, batch * config.data.seq_len, path, checkpointing) +
            (bf16 ? 2 * config.model.parameters() : 0);
        // The caching allocator rounds each block up to 512 bytes; 5% leaves room for that.
        EXPECT_NEAR(static_cast<double>(measured), planned, 0.05 * measured)
            << config.train.kernels << (bf16 ? ", bf16" : ", fp32")
            << (checkpointing ? ", checkpointing" : "");
      }
    }
  }
}

}  // namespace
}  // namespace mltrain
