// mlprep as a user runs it: what it prints and how it exits.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;

CommandResult mlprep(const std::string& arguments) {
  return testing::run_tool("mlprep", arguments);
}

TEST(MlprepCli, PreparesAFortuneCorpus) {
  testing::TemporaryDirectory dir;
  const CommandResult run = mlprep(
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 --out " +
      (dir / "out").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "bytes per token");
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "val_000000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "tokenizer.model"));

  // Encoding with the tokenizer just made, instead of training another, gives the same shards.
  const CommandResult again =
      mlprep("--input /usr/share/games/fortunes/computers --format fortune --tokenizer " +
             (dir / "out" / "tokenizer.model").string() + " --out " + (dir / "again").string());
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::read_text(dir / "again" / "train_000000.bin"),
            testing::read_text(dir / "out" / "train_000000.bin"));
}

TEST(MlprepCli, BadInputExitsTwoWithOneLine) {
  testing::TemporaryDirectory dir;
  const std::string out = " --out " + (dir / "out").string();
  const CommandResult unreadable = mlprep("--input " + (dir / "nope.txt").string() + out);
  EXPECT_EQ(unreadable.exit_code, kExitUserError);
  EXPECT_CONTAINS(unreadable.output, "nope.txt: cannot read the input file");
  const CommandResult tokenizer =
      mlprep("--input /usr/share/games/fortunes/computers --format fortune --tokenizer " +
             (dir / "no.model").string() + out);
  EXPECT_EQ(tokenizer.exit_code, kExitUserError);
  EXPECT_CONTAINS(tokenizer.output, "no.model: tokenizer model not found");
  const CommandResult format = mlprep("--input x --format csv" + out);
  EXPECT_EQ(format.exit_code, kExitUserError);
  EXPECT_CONTAINS(format.output, "--format csv: expected text, jsonl or fortune");
  const CommandResult vocab = mlprep("--input x --vocab-size lots" + out);
  EXPECT_EQ(vocab.exit_code, kExitUserError);
  EXPECT_CONTAINS(
      vocab.output,
      "--vocab-size: expected an integer of at least 260, got \"lots\" (see mlprep --help)");
  EXPECT_EQ(mlprep(out).exit_code, kExitUserError);
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST(MlprepCli, UnknownFlagIsOneLineAndExitTwo) {
  const CommandResult run = mlprep("--input x --out y --vocab 400");
  EXPECT_EQ(run.exit_code, kExitUserError);
  EXPECT_CONTAINS(run.output, "unknown option --vocab (see mlprep --help)");
  EXPECT_EQ(lines(run.output), 1u) << run.output;
  // A misspelt required flag is reported as unknown rather than as missing.
  EXPECT_CONTAINS(mlprep("--inptu x --out y").output, "unknown option --inptu (see mlprep --help)");
}

TEST(MlprepCli, BadNumbersAreOneLineAndExitTwo) {
  const std::string files = "--input x --out y ";
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"--vocab-size 259", "--vocab-size: expected an integer of at least 260, got \"259\""},
           {"--shard-tokens 0", "--shard-tokens: expected an integer of at least 1, got \"0\""},
           {"--threads 2x", "--threads: expected an integer of at least 1, got \"2x\""},
           {"--seed -1", "--seed: expected an integer of at least 0, got \"-1\""},
           {"--val-fraction 1", "--val-fraction: expected a number in [0, 1), got \"1\""},
           {"--val-fraction half", "--val-fraction: expected a number in [0, 1), got \"half\""}}) {
    const CommandResult run = mlprep(files + arguments);
    EXPECT_EQ(run.exit_code, kExitUserError) << arguments;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(lines(run.output), 1u) << run.output;
  }
  const CommandResult missing = mlprep("--out y");
  EXPECT_EQ(missing.exit_code, kExitUserError);
  EXPECT_CONTAINS(missing.output, "--input is required (see mlprep --help)");
  const CommandResult dangling = mlprep("--input x --out");
  EXPECT_EQ(dangling.exit_code, kExitUserError);
  EXPECT_CONTAINS(dangling.output, "--out: 1 required DIR missing (see mlprep --help)");
}

TEST(MlprepCli, HelpListsEveryFlagAndExitsZero) {
  const CommandResult run = mlprep("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_CONTAINS(run.output, "Usage: mlprep [OPTIONS]");
  for (const char* flag :
       {"-h,--help", "--input FILE", "--out DIR", "--format F", "--vocab-size N",
        "--tokenizer MODEL", "--val-fraction F", "--shard-tokens N", "--threads N", "--seed N"}) {
    EXPECT_CONTAINS(run.output, flag);
  }
  EXPECT_CONTAINS(run.output, "trains a SentencePiece BPE tokenizer");
}

}  // namespace
}  // namespace mltrain
