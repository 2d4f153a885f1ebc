#pragma once

#include <filesystem>

#include "data/corpus_description.h"
#include "data/shard.h"
#include "trainer/config/config.h"

namespace mltrain::testing {

// A stream in which every token determines the next: 0, 7, 14, ... (mod 31). A model that learns
// it predicts every next token, so its loss falls from ln(32) = 3.47 towards zero.
inline void write_learnable_stream(const std::filesystem::path& path, size_t length) {
  std::vector<uint32_t> tokens(length);
  for (size_t i = 0; i < length; ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 31);
  write_shard(path, tokens, 32);
}

// The learnable stream (train_000000.bin, val_000000.bin) with a loss mask beside it, as a chat
// corpus has: runs of targets and of
// tokens that are none, of seeded lengths, so that windows hold from none to all targets.
// With `targets_wanted` false every flag is 0: a corpus with nothing to learn from.
inline void write_masked_learnable_corpus(const std::filesystem::path& directory,
                                          bool targets_wanted = true) {
  std::filesystem::create_directories(directory);
  uint32_t state = 2026;
  for (const auto& [prefix, length] : {std::pair{"train", 20000}, std::pair{"val", 2000}}) {
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> targets;
    uint8_t flag = 0;
    int run = 0;
    for (int i = 0; i < length; ++i) {
      if (run-- == 0) {
        state = state * 1664525u + 1013904223u;
        run = static_cast<int>(state >> 26);  // 0 to 63 tokens
        flag ^= 1;
      }
      tokens.push_back(static_cast<uint32_t>(i * 7 % 31));
      targets.push_back(targets_wanted ? flag : 0);
    }
    ShardSeriesWriter shards(directory, prefix, 32, length, /*with_loss_masks=*/true);
    shards.append(tokens, targets);
    shards.finish();
  }
  write_corpus_description(directory, {.chat_template = ChatTemplate::chatml, .loss_masks = true});
}

// A run of a tiny model on learnable streams in `dir` (train_000000.bin, val_000000.bin, written
// here), on the CPU in fp32, with gradient accumulation.
inline Config tiny_run(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "train_000000.bin")) {
    write_learnable_stream(dir / "train_000000.bin", 20000);
    write_learnable_stream(dir / "val_000000.bin", 2000);
  }
  Config config;
  config.model = {.vocab_size = 32,
                  .d_model = 32,
                  .n_layers = 2,
                  .n_q_heads = 4,
                  .n_kv_heads = 2,
                  .head_dim = 8,
                  .d_ffn = 64,
                  .max_seq_len = 32};
  config.data.train = (dir / "train_*.bin").string();
  config.data.val = (dir / "val_*.bin").string();
  config.data.tokenizer = "";
  config.data.seq_len = 16;
  config.data.micro_batch = 8;
  config.data.grad_accum = 2;
  config.optim.lr = 1e-2;
  config.optim.min_lr = 1e-3;
  config.optim.warmup_steps = 5;
  config.train.max_steps = 60;
  config.train.precision = "fp32";
  config.train.device = "cpu";
  config.train.run_dir = (dir / "run").string();
  config.train.log_every = 10;
  config.train.eval_every = 20;
  config.train.eval_batches = 0;
  config.train.ckpt_every = 1000;
  return config;
}

}  // namespace mltrain::testing
