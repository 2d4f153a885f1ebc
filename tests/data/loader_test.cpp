#include "data/loader.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>

#include "tests/support/test_support.h"

namespace mltrain {
namespace {

TEST(Loader, DeliversTheSamplersWindowsInTrainingOrder) {
  testing::TemporaryDirectory dir;
  std::vector<uint32_t> tokens(4000);
  std::iota(tokens.begin(), tokens.end(), 0);
  write_shard(dir / "train_000000.bin", tokens, 4096);
  const TokenWindows windows((dir / "train_*.bin").string(), 16, 4096);
  const BatchLayout layout{.micro_batch = 3, .grad_accum = 2, .world_size = 2};
  BlendedSampler reference({{windows.num_windows(), 1.0, 5}}, layout, {0, {0}});

  const int64_t start = 5 * layout.global_batch();  // as if resumed after 5 steps
  Loader loader({&windows}, BlendedSampler({{windows.num_windows(), 1.0, 5}}, layout, {0, {0}}),
                /*rank=*/1, start, /*prefetch=*/2, /*pin_memory=*/false);
  for (int64_t step = 5; step < 40; ++step) {  // 40 steps run past the first epoch
    for (int64_t micro = 0; micro < 2; ++micro) {
      const MicroBatch batch = loader.next();
      std::vector<int64_t> indices;
      for (const auto& sample : reference.windows(step * layout.global_batch(), micro, 1))
        indices.push_back(sample.window);
      ASSERT_EQ(batch.tokens.sizes(), (std::vector<int64_t>{3, 17}));
      EXPECT_EQ(batch.windows, indices);
      for (int64_t row = 0; row < 3; ++row) {
        // Window w of a counting shard holds 16 w, 16 w + 1, ..., 16 w + 16.
        EXPECT_TRUE(
            at::equal(batch.tokens[row], at::arange(16 * indices[row], 16 * indices[row] + 17)))
            << "step " << step << " micro " << micro << " row " << row;
      }
    }
  }
  EXPECT_GE(loader.waited_seconds(), 0.0);
}

}  // namespace
}  // namespace mltrain
