// Damaged checkpoints and impossible batches, met as a user meets them: one line, exit code 2, and
// every saved checkpoint left as it was.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/launch/trained_run.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::TemporaryDirectory;
using testing::trained_run;

CommandResult run(const std::string& executable, const std::string& arguments) {
  return testing::run_tool(executable, arguments);
}

// Flips one byte in the middle of `path`; returns the original bytes.
std::string corrupt(const std::filesystem::path& path) {
  const std::string original = testing::read_text(path);
  std::string flipped = original;
  flipped[flipped.size() / 2] ^= 0x10;
  testing::write_text(path, flipped);
  return original;
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST(CheckpointCli, EvalOnlyAndMlgenRefuseCorruptedWeights) {
  TemporaryDirectory dir;
  const std::string config = trained_run(dir);
  const auto weights = dir / "run" / "checkpoints" / "step_00000004" / "model.safetensors";
  const std::string original = corrupt(weights);
  const std::string corrupted = testing::read_text(weights);
  for (const std::string& resume :
       {std::string("auto"), (dir / "run" / "checkpoints" / "step_00000004").string(),
        weights.string()}) {
    const CommandResult evaluated = run("mltrain", config + " --eval-only --resume " + resume);
    EXPECT_EQ(evaluated.exit_code, kExitUserError) << evaluated.output;
    EXPECT_CONTAINS(evaluated.output, "model.safetensors: checksum mismatch");
    EXPECT_EQ(evaluated.output.find("val loss"), std::string::npos) << evaluated.output;
  }
  const CommandResult generated = run("mlgen", (dir / "run").string() + " --prompt x");
  EXPECT_EQ(generated.exit_code, kExitUserError) << generated.output;
  EXPECT_CONTAINS(generated.output, "model.safetensors: checksum mismatch");
  EXPECT_EQ(testing::read_text(weights), corrupted) << "a reader must not change the checkpoint";

  testing::write_text(weights, original);
  const CommandResult intact = run("mltrain", config + " --eval-only --resume auto");
  EXPECT_EQ(intact.exit_code, 0) << intact.output;
  EXPECT_CONTAINS(intact.output, "val loss");
}

TEST(CheckpointCli, ADamagedNewestCheckpointNamesTheIntactOlderOne) {
  TemporaryDirectory dir;
  const std::string config = trained_run(dir);
  const auto checkpoints = dir / "run" / "checkpoints";
  corrupt(checkpoints / "step_00000004" / "optimizer.safetensors");
  const std::string older_weights =
      testing::read_text(checkpoints / "step_00000002" / "model.safetensors");
  const CommandResult resumed = run("mltrain", config + " --resume auto --set train.max_steps=6");
  EXPECT_EQ(resumed.exit_code, kExitUserError) << resumed.output;
  EXPECT_CONTAINS(resumed.output, "step_00000004/optimizer.safetensors: checksum mismatch");
  EXPECT_CONTAINS(resumed.output,
                  "the older checkpoint step_00000002 is intact: continue from it with --resume " +
                      (checkpoints / "step_00000002").string());
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000004\n");

  // The command it names works.
  const CommandResult from_older = run("mltrain", config + " --set train.max_steps=6 --resume " +
                                                      (checkpoints / "step_00000002").string());
  EXPECT_EQ(from_older.exit_code, 0) << from_older.output;
  EXPECT_CONTAINS(from_older.output, "resuming from");
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000006" / "state.json"));
  EXPECT_EQ(testing::read_text(checkpoints / "step_00000002" / "model.safetensors"), older_weights);
}

TEST(CheckpointCli, ABatchLargerThanTheTrainingDataIsOneLineAndExitTwo) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const CommandResult oversized =
      run("mltrain", (dir / "run.yaml").string() + " --set data.micro_batch=100000000");
  EXPECT_EQ(oversized.exit_code, kExitUserError) << oversized.output;
  // 20000 training tokens make (20000 - 1) / seq_len 16 = 1249 windows.
  EXPECT_CONTAINS(oversized.output,
                  "a global batch of 200000000 windows (data.micro_batch 100000000 x "
                  "data.grad_accum 2 x 1 ranks) is more than the 1249 windows of the "
                  "training data");
  EXPECT_LE(lines(oversized.output), 3u)
      << "the train and val data lines, then the error: " << oversized.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

}  // namespace
}  // namespace mltrain
