// The smoke config end to end, as a user runs it: prepare a corpus, train, evaluate, sample.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::run_command;

TEST(SmokeRun, TrainsEvaluatesAndSamples) {
  testing::TemporaryDirectory dir;
  const std::string data = (dir / "data").string();
  const std::string run_dir = (dir / "run").string();
  const CommandResult prep = run_command(
      std::string(MLTRAIN_BIN_DIR) + "/mlprep --format fortune --vocab-size 1024 --out " + data +
      " --input /usr/share/games/fortunes/computers /usr/share/games/fortunes/tang300");
  ASSERT_EQ(prep.exit_code, 0) << prep.output;

  // The shipped smoke config, shortened for the test suite and pointed at this corpus.
  const std::string config =
      std::string(MLTRAIN_SOURCE_DIR) + "/configs/smoke.yaml --set data.train=" + data +
      "/train_*.bin --set data.val=" + data + "/val_*.bin --set data.tokenizer=" + data +
      "/tokenizer.model --set train.run_dir=" + run_dir + " --set train.device=cpu";
  const std::string mltrain = std::string(MLTRAIN_BIN_DIR) + "/mltrain ";
  const CommandResult train =
      run_command(mltrain + config +
                  " --set train.max_steps=24 --set optim.warmup_steps=4 --set train.eval_every=8");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_CONTAINS(train.output, "step 24/24");
  EXPECT_EQ(train.output.find("update skipped"), std::string::npos)
      << "the spike guard's default must not fire on a healthy run\n"
      << train.output;

  std::vector<double> val_losses;
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);  // every line is JSON
    if (record.contains("val_loss")) val_losses.push_back(record["val_loss"].get<double>());
  }
  ASSERT_EQ(val_losses.size(), 3u);
  EXPECT_LT(val_losses.back(), val_losses.front());

  const CommandResult evaluate = run_command(mltrain + config + " --eval-only --resume auto");
  EXPECT_EQ(evaluate.exit_code, 0) << evaluate.output;
  EXPECT_CONTAINS(evaluate.output, "val loss");

  // Document masking takes the end-of-document token from the corpus's tokenizer, and finds it in
  // the shards mlprep wrote.
  const CommandResult masked =
      run_command(mltrain + config + " --set data.document_masking=true --set train.max_steps=4" +
                  " --set optim.warmup_steps=1 --set train.run_dir=" + (dir / "masked").string());
  EXPECT_EQ(masked.exit_code, 0) << masked.output;
  EXPECT_CONTAINS(masked.output, "(the tokenizer's end-of-document token), its positions counted");
  EXPECT_EQ(masked.output.find("hold no token"), std::string::npos) << masked.output;

  const CommandResult sample = run_command(std::string(MLTRAIN_BIN_DIR) + "/mlgen " + run_dir +
                                           " --prompt 'The ' --tokens 8");
  EXPECT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_EQ(sample.output.rfind("The ", 0), 0u) << sample.output;
  // The run's newest checkpoint named itself gives the same text (stdout alone: no rates).
  const auto text_of = [](const std::string& source) {
    return run_command("(" MLTRAIN_BIN_DIR "/mlgen " + source +
                       " --prompt 'The ' --tokens 8 2>/dev/null)");
  };
  const CommandResult from_run = text_of(run_dir);
  const CommandResult from_checkpoint = text_of(run_dir + "/checkpoints/step_00000024");
  EXPECT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.output;
  EXPECT_EQ(from_checkpoint.output, from_run.output);
}

TEST(SmokeRun, EvalOnlyWithoutWeightsIsAClearError) {
  testing::TemporaryDirectory dir;
  const std::string mltrain =
      std::string(MLTRAIN_BIN_DIR) + "/mltrain " + MLTRAIN_SOURCE_DIR + "/configs/smoke.yaml";
  const CommandResult no_resume = run_command(mltrain + " --eval-only");
  EXPECT_EQ(no_resume.exit_code, kExitUserError);
  EXPECT_CONTAINS(no_resume.output, "--eval-only needs trained weights");
  const CommandResult missing =
      run_command(mltrain + " --eval-only --resume " + (dir / "nothing").string());
  EXPECT_EQ(missing.exit_code, kExitUserError);
  EXPECT_CONTAINS(missing.output, "no weights here");
  const CommandResult no_data = run_command(
      mltrain + " --set 'data.tokenizer=\"\"' --set data.train=" + (dir / "none_*.bin").string() +
      " --set train.run_dir=" + (dir / "run").string());
  EXPECT_EQ(no_data.exit_code, kExitUserError);
  EXPECT_CONTAINS(no_data.output, "no token shards match");
}

}  // namespace
}  // namespace mltrain
