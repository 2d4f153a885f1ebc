#include "trainer/training_run.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/evaluation.h"

namespace mltrain {
namespace {

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

TEST(TrainingRun, LearnsALearnableStream) {
  testing::TemporaryDirectory dir;
  const Config config = testing::tiny_run(dir.path());
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
  EXPECT_EQ(logged_steps, 7);        // step 1, then every 10
  ASSERT_EQ(val_losses.size(), 3u);  // steps 20, 40, 60
  EXPECT_LT(val_losses.back(), 0.2) << "from ln 32 = 3.47";

  // Evaluating the saved weights reproduces the run's final validation loss.
  const Evaluation evaluation = evaluate_weights(config, dir / "run");
  EXPECT_NEAR(evaluation.loss, val_losses.back(), 1e-6);
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "config.yaml"));
}

// llm.c-style shards come without a tokenizer.model: training reads tokens and needs none.
TEST(TrainingRun, TrainsWithoutATokenizerAtTheDefaultPath) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 2;
  config.data.tokenizer = DataConfig{}.tokenizer;
  ASSERT_FALSE(std::filesystem::exists(config.data.tokenizer));
  train(config);
  EXPECT_TRUE(
      std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000002" / "state.json"));
}

TEST(TrainingRun, AMissingTokenizerThatWasAskedForIsAnError) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.data.tokenizer = (dir / "tokenizer.model").string();
  try {
    train(config);
    FAIL() << "trained without the tokenizer it was given";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "tokenizer.model: tokenizer model not found");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints"));
}

}  // namespace
}  // namespace mltrain
