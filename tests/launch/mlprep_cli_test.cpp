// mlprep as a user runs it: what it prints and how it exits.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;


CommandResult mlprep(const std::string& arguments) {
  std::string command = MLTRAIN_BIN_DIR "/mlprep ";
  command += arguments;
  return testing::run_command(command);
}

TEST(MlprepCli, PreparesAFortuneCorpus) {
  testing::TemporaryDirectory dir;
  const CommandResult run = mlprep("--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 --out " +
                                   (dir / "out").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "bytes per token");
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "val_000000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "tokenizer.model"));

  // Encoding with the tokenizer just made, instead of training another, gives the same shards.
  const CommandResult again = mlprep("--input /usr/share/games/fortunes/computers --format fortune --tokenizer " +
                                     (dir / "out" / "tokenizer.model").string() + " --out " + (dir / "again").string());
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::read_text(dir / "again" / "train_000000.bin"), testing::read_text(dir / "out" / "train_000000.bin"));
}

TEST(MlprepCli, BadInputExitsTwoWithOneLine) {
  testing::TemporaryDirectory dir;
  const std::string out = " --out " + (dir / "out").string();
  const CommandResult unreadable = mlprep("--input " + (dir / "nope.txt").string() + out);
  EXPECT_EQ(unreadable.exit_code, kExitUserError);
  EXPECT_CONTAINS(unreadable.output, "nope.txt: cannot read the input file");
  const CommandResult tokenizer = mlprep("--input /usr/share/games/fortunes/computers --format fortune --tokenizer " +
                                         (dir / "no.model").string() + out);
  EXPECT_EQ(tokenizer.exit_code, kExitUserError);
  EXPECT_CONTAINS(tokenizer.output, "no.model: tokenizer model not found");
  const CommandResult format = mlprep("--input x --format csv" + out);
  EXPECT_EQ(format.exit_code, kExitUserError);
  EXPECT_CONTAINS(format.output, "--format csv: expected text, jsonl or fortune");
  const CommandResult vocab = mlprep("--input x --vocab-size lots" + out);
  EXPECT_EQ(vocab.exit_code, kExitUserError);
  EXPECT_CONTAINS(vocab.output, "--vocab-size expects an integer");
  EXPECT_EQ(mlprep(out).exit_code, kExitUserError);
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
}

}  // namespace
}  // namespace mltrain
