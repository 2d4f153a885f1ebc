// A run directory has one owner, and what it holds survives whatever happens beside it: a second
// run on it, a shard that changes under the run, a directory that cannot be written.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include "common/error.h"
#include "tests/launch/fault_support.h"
#include "tests/launch/trained_run.h"
#include "tests/support/test_support.h"
#include "trainer/checkpoint/checkpoint_format.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::mltrain;
using testing::run_command;
using testing::TemporaryDirectory;
using testing::wait_for_step;
using testing::write_config;

size_t count(const std::string& text, const std::string& part) {
  size_t found = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++found;
  return found;
}

// Two runs on one directory once both said they saved the same checkpoint, and one of the two was
// lost. The second is refused at once, naming the first, and touches nothing; the lock goes with
// the process that held it.
TEST(RunDirectory, ASecondRunIsRefusedAndTheFirstGoesOn) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000) + " --set train.ckpt_every=2";
  testing::BackgroundProcess first(mltrain(endless), dir / "first.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  for (const std::string& second : {endless + " --resume auto --set data.seed=7", endless}) {
    const CommandResult refused = run_command(mltrain(second));
    EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
    EXPECT_CONTAINS(refused.output, "run is in use by another training run (pid ");
    EXPECT_CONTAINS(refused.output, " on host ");
    EXPECT_CONTAINS(refused.output, ", started ");
  }
  first.signal(SIGTERM);
  ASSERT_EQ(first.wait(), 0) << testing::read_text(dir / "first.txt");
  const std::string metrics = testing::read_text(dir / "run" / "metrics.jsonl");
  EXPECT_EQ(count(metrics, "\"event\":\"start\""), 1u) << "one run wrote the metrics";
  const int64_t stopped = testing::latest_step(dir / "run");
  verify_checkpoint(dir / "run" / "checkpoints" / fmt::format("step_{:08d}", stopped));

  const CommandResult next = run_command(
      mltrain(endless + " --resume auto --set train.max_steps=" + std::to_string(stopped + 1)));
  EXPECT_EQ(next.exit_code, 0) << next.output;
}

// A config kept by hand at RUN_DIR/config.yaml, where a run writes its effective config, was
// written over, its comments and values lost. It is moved aside to config.yaml.replaced-1, once:
// the effective config written in its place resumes the run and is rewritten, not moved again.
TEST(RunDirectory, AConfigOfTheUsersAtTheEffectiveConfigsPathIsKeptAside) {
  TemporaryDirectory dir;
  write_config(dir, 2);
  const auto own = dir / "run" / "config.yaml";
  std::filesystem::create_directories(own.parent_path());
  const std::string text = "# keep me\n" + testing::read_text(dir / "run.yaml");
  testing::write_text(own, text);

  const CommandResult trained = run_command(mltrain(own.string() + " --set optim.warmup_steps=1"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_CONTAINS(trained.output,
                  "is not a config mltrain wrote (one of yours?): kept as "
                  "config.yaml.replaced-1");
  EXPECT_EQ(testing::read_text(dir / "run" / "config.yaml.replaced-1"), text);
  EXPECT_TRUE(testing::read_text(own).starts_with("# The effective config of this run"));

  const CommandResult resumed =
      run_command(mltrain(own.string() + " --resume auto --set train.max_steps=3"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "config.yaml.replaced-2"));
  EXPECT_CONTAINS(testing::read_text(own), "max_steps: 3");
}

// run.lock removed while a run holds it (taken for a stale lock) let a second run into the
// directory, and both wrote the same checkpoints. The run takes the lock again at its next step,
// and a second run is refused as before.
TEST(RunDirectory, ALockFileRemovedUnderARunIsTakenAgain) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000) + " --set train.ckpt_every=2";
  testing::BackgroundProcess first(mltrain(endless), dir / "first.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  const auto lock = dir / "run" / "run.lock";
  std::filesystem::remove(lock);
  for (int tries = 0; tries < 600 && !std::filesystem::exists(lock); ++tries) ::usleep(50'000);
  ASSERT_TRUE(std::filesystem::exists(lock)) << "not taken again";

  const CommandResult second = run_command(mltrain(endless + " --resume auto"));
  EXPECT_EQ(second.exit_code, kExitUserError) << second.output;
  EXPECT_CONTAINS(second.output, "run is in use by another training run (pid ");
  first.signal(SIGTERM);
  ASSERT_EQ(first.wait(), 0);
  EXPECT_CONTAINS(testing::read_text(dir / "first.txt"),
                  "was removed while this training run held it (taken for a stale lock?): taken "
                  "again");
}

// The kernel drops the lock of a process that is killed: no stale lock stops the next run.
TEST(RunDirectory, AKilledRunLeavesNoLockBehind) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000) + " --set train.ckpt_every=2";
  testing::BackgroundProcess killed(mltrain(endless), dir / "killed.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  killed.signal(SIGKILL);
  ASSERT_EQ(killed.wait(), 128 + SIGKILL);
  const CommandResult next =
      run_command(mltrain(endless + " --resume auto --set train.max_steps=6"));
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_CONTAINS(next.output, "resuming from");
}

// A shard truncated while the run reads it once killed the run with SIGBUS and no word. The run
// now ends with exit 1 and one line naming the shard and what changed; its checkpoints are whole.
TEST(RunDirectory, AShardTruncatedUnderARunEndsItWithOneLine) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000) + " --set train.ckpt_every=2";
  testing::BackgroundProcess run(mltrain(endless), dir / "log.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  const auto shard = dir / "train_000000.bin";
  const auto bytes = std::filesystem::file_size(shard);
  std::filesystem::resize_file(shard, 2000);
  EXPECT_EQ(run.wait(), kExitRuntimeFailure) << testing::read_text(dir / "log.txt");
  const std::string log = testing::read_text(dir / "log.txt");
  EXPECT_CONTAINS(log, fmt::format("{}: the token shard changed while mltrain read it (it was {} "
                                   "bytes and is now 2000 (truncated))",
                                   shard.string(), bytes));
  EXPECT_EQ(log.find("Bus error"), std::string::npos) << log;
  const int64_t saved = testing::latest_step(dir / "run");
  EXPECT_GE(saved, 2);
  verify_checkpoint(dir / "run" / "checkpoints" / fmt::format("step_{:08d}", saved));
}

// `command` with `directory` read-only: as root, whom permissions do not stop, in a mount namespace
// of its own where the directory is mounted read-only; otherwise by its mode.
CommandResult run_with_read_only(const std::filesystem::path& directory,
                                 const std::string& command) {
  if (::geteuid() != 0) {
    std::filesystem::permissions(directory, std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::remove);
    const CommandResult result = run_command(command);
    std::filesystem::permissions(directory, std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::add);
    return result;
  }
  return run_command("unshare -m sh -c 'mount --bind -o ro " + directory.string() + " " +
                     directory.string() + " && exec " + command + "'");
}

// A directory mltrain may not write is the user's to fix: exit 2 naming it, not a raw filesystem
// error with exit 1. An evaluation that worked says it could not record its result.
TEST(RunDirectory, ADirectoryThatCannotBeWrittenIsNamed) {
  if (::geteuid() == 0 && run_command("unshare -m true").exit_code != 0)
    GTEST_SKIP() << "root without a mount namespace of its own cannot make a directory read-only";
  TemporaryDirectory dir;
  const std::string config = testing::trained_run(dir);
  const auto run_dir = dir / "run";
  const std::string metrics = testing::read_text(run_dir / "metrics.jsonl");

  const CommandResult resumed =
      run_with_read_only(run_dir, mltrain(config + " --resume auto --set train.max_steps=6"));
  EXPECT_EQ(resumed.exit_code, kExitUserError) << resumed.output;
  EXPECT_CONTAINS(resumed.output, "train.run_dir " + run_dir.string() + ": cannot write there");

  // Found before the first step: a checkpoint directory that cannot be written.
  const CommandResult unsavable = run_with_read_only(
      run_dir / "checkpoints", mltrain(config + " --resume auto --set train.max_steps=6"));
  EXPECT_EQ(unsavable.exit_code, kExitUserError) << unsavable.output;
  EXPECT_CONTAINS(unsavable.output, (run_dir / "checkpoints").string() + ": cannot write there");
  EXPECT_EQ(unsavable.output.find("step 5/"), std::string::npos) << unsavable.output;

  const CommandResult evaluated =
      run_with_read_only(run_dir, mltrain(config + " --eval-only --resume auto"));
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_CONTAINS(evaluated.output, "val loss");
  EXPECT_CONTAINS(evaluated.output, "the evaluation is not recorded in " + run_dir.string());
  EXPECT_EQ(testing::read_text(run_dir / "metrics.jsonl"), metrics);

  std::filesystem::create_directory(dir / "exports");
  const CommandResult exported = run_with_read_only(
      dir / "exports",
      mltrain(config + " --resume auto --export-hf " + (dir / "exports" / "hf").string()));
  EXPECT_EQ(exported.exit_code, kExitUserError) << exported.output;
  EXPECT_CONTAINS(exported.output,
                  "--export-hf " + (dir / "exports" / "hf").string() + ": cannot write there");
}

}  // namespace
}  // namespace mltrain
