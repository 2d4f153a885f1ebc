#include "data/loader.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>

#include "data/corpus_description.h"
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

// With loss masks each micro-batch carries its targets' flags, and every rank's loader counts the
// targets of the whole step, over every rank and micro-step, alike.
TEST(Loader, WithLossMasksGivesEachWindowsTargetsAndTheWholeStepsCount) {
  testing::TemporaryDirectory dir;
  std::vector<uint32_t> tokens(4000);
  std::vector<uint8_t> targets(4000);
  std::iota(tokens.begin(), tokens.end(), 0);
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = (i * i) % 7 < 3 ? 1 : 0;
  ShardSeriesWriter shards(dir.path(), "train", 4096, 4000, /*with_loss_masks=*/true);
  shards.append(tokens, targets);
  shards.finish();
  write_corpus_description(dir.path(), {.chat_template = std::nullopt, .loss_masks = true});
  const TokenWindows windows((dir / "train_*.bin").string(), 16, 4096);
  ASSERT_TRUE(windows.has_loss_masks());
  const BatchLayout layout{.micro_batch = 3, .grad_accum = 2, .world_size = 2};
  const auto loader_of = [&](int64_t rank) {
    return std::make_unique<Loader>(
        std::vector<const TokenWindows*>{&windows},
        BlendedSampler({{windows.num_windows(), 1.0, 5}}, layout, {0, {0}}), rank, 0,
        /*prefetch=*/2, /*pin_memory=*/false);
  };
  const auto rank0 = loader_of(0);
  const auto rank1 = loader_of(1);
  for (int64_t step = 0; step < 5; ++step) {
    int64_t counted = 0;
    std::vector<int64_t> step_targets;
    for (int64_t micro = 0; micro < 2; ++micro) {
      for (Loader* loader : {rank0.get(), rank1.get()}) {
        const MicroBatch batch = loader->next();
        ASSERT_EQ(batch.target_mask.sizes(), (std::vector<int64_t>{3, 16}));
        for (int64_t row = 0; row < 3; ++row) {
          // Window w's targets are tokens 16 w + 1 ... 16 w + 16.
          for (int64_t t = 0; t < 16; ++t) {
            const size_t token = static_cast<size_t>(16 * batch.windows[row] + 1 + t);
            EXPECT_EQ(batch.target_mask[row][t].item<uint8_t>(), targets[token]);
          }
        }
        counted += batch.target_mask.sum().item<int64_t>();
        step_targets.push_back(batch.step_targets);
      }
    }
    EXPECT_EQ(step_targets, std::vector<int64_t>(4, counted)) << "step " << step;
  }
}

// A blend of a masked and a plain corpus, resumed at step 7: every micro-batch's step count is
// the whole step's, counted afresh from the samples of every rank, and the windows stay those of
// the training order.
TEST(Loader, ABlendOfMaskedAndPlainCorporaCountsEachStepsTargetsAfterAResume) {
  testing::TemporaryDirectory dir;
  std::filesystem::create_directories(dir / "chat");
  std::vector<uint32_t> tokens(3000);
  std::vector<uint8_t> targets(3000);
  std::iota(tokens.begin(), tokens.end(), 0);
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = (i / 5) % 3 == 0 ? 1 : 0;
  ShardSeriesWriter shards(dir / "chat", "train", 4096, 3000, /*with_loss_masks=*/true);
  shards.append(tokens, targets);
  shards.finish();
  write_corpus_description(dir / "chat", {.chat_template = std::nullopt, .loss_masks = true});
  write_shard(dir / "train_000000.bin", tokens, 4096);
  const TokenWindows chat((dir / "chat" / "train_*.bin").string(), 16, 4096);
  const TokenWindows plain((dir / "train_*.bin").string(), 16, 4096);
  const BatchLayout layout{.micro_batch = 2, .grad_accum = 3, .world_size = 2};
  const auto blend = [&] {
    return BlendedSampler({{chat.num_windows(), 2.0, 5}, {plain.num_windows(), 1.0, 6}}, layout,
                          {0, {0, 0}});
  };
  const std::vector<const TokenWindows*> sources = {&chat, &plain};
  const int64_t start = 7 * layout.global_batch();
  Loader loader(sources, blend(), /*rank=*/1, start, /*prefetch=*/3, /*pin_memory=*/false);
  BlendedSampler reference = blend();
  for (int64_t step = 7; step < 30; ++step) {
    int64_t expected = 0;
    std::vector<std::vector<int64_t>> rank1_windows;
    for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
      for (int64_t rank = 0; rank < layout.world_size; ++rank) {
        std::vector<int64_t> windows;
        for (const auto& sample : reference.windows(step * layout.global_batch(), micro, rank)) {
          std::vector<uint8_t> flags(16);
          sources[sample.source]->read_targets(sample.window, flags);
          expected += std::count(flags.begin(), flags.end(), uint8_t{1});
          windows.push_back(sample.source == 0 ? sample.window
                                               : chat.num_windows() + sample.window);
        }
        if (rank == 1) rank1_windows.push_back(windows);
      }
    }
    for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
      const MicroBatch batch = loader.next();
      EXPECT_EQ(batch.windows, rank1_windows[micro]) << "step " << step << " micro " << micro;
      EXPECT_EQ(batch.step_targets, expected) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace mltrain
