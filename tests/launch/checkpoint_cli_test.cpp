// Damaged checkpoints and impossible batches, met as a user meets them: one line, exit code 2, and
// every saved checkpoint left as it was.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/launch/trained_run.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/config/config.h"

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

// A run directory carries what its checkpoints need. Moved elsewhere and used from another working
// directory, its newest checkpoint evaluates, samples and exports with no config given (the one
// saved with it names its data by absolute paths); with the corpus gone too, as on another
// machine, it still samples and exports (the checkpoint holds the tokenizer) and evaluates on
// validation data named anew.
TEST(CheckpointCli, AMovedRunIsUsedFromAnyDirectory) {
  TemporaryDirectory dir;
  const std::filesystem::path origin = dir / "origin";
  std::filesystem::create_directories(origin);
  const CommandResult prepared = testing::run_tool_in(
      origin, "mlprep",
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 --out data");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  // Paths relative to the directory the run starts in, as a user writes them.
  Config config = testing::tiny_run(dir.path());
  config.model.vocab_size = 512;
  config.data.train = "data/train_*.bin";
  config.data.val = "data/val_*.bin";
  config.data.tokenizer = "data/tokenizer.model";
  config.train.run_dir = "runs/r";
  config.train.max_steps = 2;
  config.optim.warmup_steps = 1;
  testing::write_text(origin / "run.yaml", config_to_yaml(config));
  const CommandResult trained = testing::run_tool_in(origin, "mltrain", "run.yaml");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;

  std::filesystem::create_directories(dir / "elsewhere");
  std::filesystem::create_directories(dir / "other");
  const std::filesystem::path moved = dir / "elsewhere" / "r";
  std::filesystem::rename(origin / "runs" / "r", moved);
  const CommandResult evaluated =
      testing::run_tool_in(dir / "other", "mltrain", "--eval-only --resume " + moved.string());
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_CONTAINS(evaluated.output, "val loss");
  EXPECT_CONTAINS(testing::read_text(moved / "metrics.jsonl"), "\"event\":\"eval_only\"");

  const std::filesystem::path corpus = dir / "corpus_elsewhere";
  std::filesystem::rename(origin / "data", corpus);
  const CommandResult sampled = testing::run_tool_in(
      dir / "other", "mlgen", moved.string() + " --prompt 'The ' --max-new-tokens 4");
  EXPECT_EQ(sampled.exit_code, 0) << sampled.output;
  EXPECT_CONTAINS(sampled.output, "generation: 4 tokens");
  const CommandResult exported = testing::run_tool_in(
      dir / "other", "mltrain", "--resume " + moved.string() + " --export-hf hf");
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(testing::read_text(dir / "other" / "hf" / "tokenizer.model"),
            testing::read_text(corpus / "tokenizer.model"));

  const CommandResult without_data =
      testing::run_tool_in(dir / "other", "mltrain", "--eval-only --resume " + moved.string());
  EXPECT_EQ(without_data.exit_code, kExitUserError) << without_data.output;
  EXPECT_CONTAINS(without_data.output, (origin / "data" / "val_*.bin").string());
  const CommandResult with_data =
      testing::run_tool_in(dir / "other", "mltrain",
                           "--eval-only --resume " + moved.string() +
                               " --set data.val=" + (corpus / "val_*.bin").string());
  EXPECT_EQ(with_data.exit_code, 0) << with_data.output;

  // The tokenizer is checked like every other file of the checkpoint.
  corrupt(moved / "checkpoints" / "step_00000002" / "tokenizer.model");
  const CommandResult damaged = testing::run_tool_in(dir / "other", "mlgen", moved.string());
  EXPECT_EQ(damaged.exit_code, kExitUserError) << damaged.output;
  EXPECT_CONTAINS(damaged.output, "tokenizer.model: checksum mismatch");
}

// A Hugging Face directory, or weights outside a run, come with no config: one is asked for. A
// run that had no tokenizer (the default path, with nothing there) is evaluated without one too.
TEST(CheckpointCli, WithoutAConfigTheWeightsMustBeARunsCheckpoint) {
  TemporaryDirectory dir;
  const std::string config = trained_run(dir);
  const std::string untokenized = (dir / "untokenized").string();
  const CommandResult trained =
      testing::run_tool_in(dir.path(), "mltrain",
                           config +
                               " --set data.tokenizer=data/shards/tokenizer.model "
                               "--set train.max_steps=2 --set train.run_dir=" +
                               untokenized);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const CommandResult evaluated = run("mltrain", "--eval-only --resume " + untokenized);
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.output;

  const auto checkpoint = dir / "run" / "checkpoints" / "step_00000004";
  std::filesystem::create_directories(dir / "loose");
  std::filesystem::copy_file(checkpoint / "model.safetensors", dir / "loose" / "model.safetensors");
  const CommandResult loose = run("mltrain", "--eval-only --resume " + (dir / "loose").string());
  EXPECT_EQ(loose.exit_code, kExitUserError) << loose.output;
  EXPECT_CONTAINS(loose.output, "no config is saved with these weights");
  EXPECT_EQ(lines(loose.output), 1u) << loose.output;

  const CommandResult automatic = run("mltrain", "--eval-only --resume auto");
  EXPECT_EQ(automatic.exit_code, kExitUserError) << automatic.output;
  EXPECT_CONTAINS(automatic.output, "--resume auto is the newest checkpoint of the config's");
  const CommandResult training = run("mltrain", "--resume " + checkpoint.string());
  EXPECT_EQ(training.exit_code, kExitUserError) << training.output;
  EXPECT_CONTAINS(training.output, "no config file given");
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
