#include "trainer/run/training_run.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/error.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/run/evaluation.h"

namespace mltrain {
namespace {

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Counts, on this thread, the reads of device values by the host: mltrain's own (read_to_host)
// and any .item() (aten::_local_scalar_dense). On CUDA each of them drains the device's queue.
// The CPU AdamW kernel reads its step counts with .item() inside the fused call, which on CUDA
// reads them on the device; those are not counted.
class DeviceReads {
 public:
  DeviceReads() {
    count_ = 0;
    optimizer_depth_ = 0;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_enter, &on_exit));
  }
  ~DeviceReads() { at::removeCallback(handle_); }
  int64_t count() const { return count_; }

 private:
  static std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& call) {
    const std::string_view name = call.name();
    if (name == "aten::_fused_adamw_") ++optimizer_depth_;
    if (optimizer_depth_ == 0 &&
        (name == "mltrain::read_device" || name == "aten::_local_scalar_dense")) {
      ++count_;
    }
    return nullptr;
  }
  static void on_exit(const at::RecordFunction& call, at::ObserverContext*) {
    if (std::string_view(call.name()) == "aten::_fused_adamw_") --optimizer_depth_;
  }
  static thread_local int64_t count_;
  static thread_local int optimizer_depth_;
  at::CallbackHandle handle_;
};
thread_local int64_t DeviceReads::count_ = 0;
thread_local int DeviceReads::optimizer_depth_ = 0;

// On CUDA the host must run ahead of the device: a step that neither logs nor checkpoints reads
// nothing back, not its loss, not its gradient norm, not whether it was skipped; with either
// optimizer.
class TrainingRunWith : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainingRunWith, ReadsTheDeviceOnlyAtStepsThatLogOrCheckpoint) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.optim.name = GetParam();
  config.train.max_steps = 12;
  config.train.log_every = 5;  // steps 1, 5, 10 and 12 log; 12 also checkpoints and evaluates
  config.train.eval_every = 1000;
  std::map<int64_t, int64_t> reads_after;  // step -> reads until the next step's gradients
  int64_t counted = 0;
  const DeviceReads reads;
  TrainingHooks hooks;
  hooks.after_gradients = [&](int64_t step, int, const std::vector<at::Tensor>&) {
    reads_after[step - 1] = reads.count() - counted;
    counted = reads.count();
  };
  train(config, "", World(), hooks);
  for (int64_t step = 1; step < 12; ++step) {
    if (step == 1 || step == 5 || step == 10) {
      EXPECT_GT(reads_after[step], 0) << "step " << step << " logs: it reads its loss";
    } else {
      EXPECT_EQ(reads_after[step], 0) << "step " << step << " read the device";
    }
  }
}

// Muon learns the stream too, in fp32 and under bf16 autocast (the Newton-Schulz iterations in
// fp32 on the CPU either way, the weights fp32).
TEST_P(TrainingRunWith, LearnsALearnableStreamInFp32AndUnderBf16Autocast) {
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    testing::TemporaryDirectory dir;
    Config config = testing::tiny_run(dir.path());
    config.optim.name = GetParam();
    config.train.precision = precision;
    train(config);
    double last_val_loss = INFINITY;
    for (const auto& record : read_metrics(dir / "run" / "metrics.jsonl"))
      if (record.contains("val_loss")) last_val_loss = record["val_loss"].get<double>();
    EXPECT_LT(last_val_loss, 0.2) << "from ln 32 = 3.47";
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TrainingRunWith, ::testing::Values("adamw", "muon"));

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
