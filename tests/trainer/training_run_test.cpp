#include "trainer/training_run.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/shard.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

// A stream in which every token determines the next: 0, 7, 14, ... (mod 31). A model that learns
// it predicts every next token, so its loss falls from ln(32) = 3.47 towards zero.
void write_learnable_stream(const std::filesystem::path& path, size_t length) {
  std::vector<uint32_t> tokens(length);
  for (size_t i = 0; i < length; ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 31);
  write_shard(path, tokens, 32);
}

Config tiny_run(const testing::TemporaryDirectory& dir) {
  Config config;
  config.model = {.vocab_size = 32, .d_model = 32, .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2,
                  .head_dim = 8, .d_ffn = 64, .max_seq_len = 32};
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
  return config;
}

TEST(TrainingRun, LearnsALearnableStream) {
  testing::TemporaryDirectory dir;
  write_learnable_stream(dir / "train_000000.bin", 20000);
  write_learnable_stream(dir / "val_000000.bin", 2000);
  const Config config = tiny_run(dir);
  train(config);

  const auto records = read_metrics(dir / "run" / "metrics.jsonl");
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.front()["event"], "start");
  std::vector<double> val_losses;
  int64_t logged_steps = 0;
  for (const auto& record : records) {
    if (record.contains("val_loss")) val_losses.push_back(record["val_loss"].get<double>());
    if (record.contains("loss")) ++logged_steps;
  }
  EXPECT_EQ(logged_steps, 7);  // step 1, then every 10
  ASSERT_EQ(val_losses.size(), 3u);  // steps 20, 40, 60
  EXPECT_LT(val_losses.back(), 0.2) << "from ln 32 = 3.47";

  // Evaluating the saved weights reproduces the run's final validation loss.
  const Evaluation evaluation = evaluate_weights(config, dir / "run");
  EXPECT_NEAR(evaluation.loss, val_losses.back(), 1e-6);
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "config.yaml"));
}

}  // namespace
}  // namespace mltrain
