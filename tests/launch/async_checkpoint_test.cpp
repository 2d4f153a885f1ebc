// train.async_checkpoint: checkpoints written on a background thread while training goes on, with
// mltrain run as a user runs it. A crash at any moment of the background write leaves the
// checkpoint before as the newest, and a run resumed from it ends with the weights of a run never
// broken. Failures are made on purpose by mltrain_faults (tests/launch/mltrain_with_faults.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/launch/fault_support.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::mltrain;
using testing::mltrain_with_fault;
using testing::read_text;
using testing::run_command;
using testing::TemporaryDirectory;
using testing::write_config;

constexpr const char* kAsync = " --set train.async_checkpoint=true";

// A run of 9 steps with a checkpoint every 3.
std::string nine_steps(const TemporaryDirectory& dir) {
  return write_config(dir, 9) + " --set train.ckpt_every=3";
}

// The checkpoint's tensors as bytes, and its state but for config.yaml's checksum: what a resume
// reads (config.yaml differs between the runs in train.run_dir and train.async_checkpoint).
void expect_same_checkpoint(const std::filesystem::path& a, const std::filesystem::path& b) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_text(a / file) == read_text(b / file)) << file;
  const auto state = [](const std::filesystem::path& checkpoint) {
    nlohmann::json json = nlohmann::json::parse(read_text(checkpoint / "state.json"));
    json["checksums_xxh3"].erase("config.yaml");
    return json;
  };
  EXPECT_EQ(state(a), state(b));
}

TEST(AsyncCheckpoints, TrainingGoesOnDuringTheWriteAndTheCheckpointsEqualSynchronousOnes) {
  TemporaryDirectory dir;
  const std::string config = nine_steps(dir);
  // The write of each checkpoint waits until two more steps are logged: a write that stopped
  // training would wait for them in vain, and fail after a minute.
  const auto async = run_command(mltrain_with_fault("checkpoint-write-waits-for-training",
                                                    config + kAsync + " --set train.max_steps=8"));
  ASSERT_EQ(async.exit_code, 0) << async.output;
  EXPECT_CONTAINS(async.output, "while training went on");
  const auto sync = run_command(
      mltrain(config + " --set train.max_steps=8 --set train.run_dir=" + (dir / "sync").string()));
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  // The copy was taken at its step: the steps trained during the write did not reach it.
  for (const char* step : {"step_00000003", "step_00000006", "step_00000008"}) {
    SCOPED_TRACE(step);
    expect_same_checkpoint(dir / "run" / "checkpoints" / step, dir / "sync" / "checkpoints" / step);
  }
  EXPECT_EQ(read_text(dir / "run" / "checkpoints" / "latest"), "step_00000008\n");
}

class KilledDuringABackgroundWrite : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledDuringABackgroundWrite, KeepsThePreviousCheckpointAndResumesBitwise) {
  TemporaryDirectory dir;
  const std::string config = nine_steps(dir) + kAsync;
  ASSERT_EQ(run_command(mltrain(config + " --set train.stop_at=3")).exit_code, 0);
  const auto checkpoints = dir / "run" / "checkpoints";
  const std::string saved = read_text(checkpoints / "step_00000003" / "model.safetensors");

  const auto killed = run_command(
      mltrain_with_fault("kill-during-checkpoint:" + GetParam(), config + " --resume auto"));
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  EXPECT_EQ(read_text(checkpoints / "latest"), "step_00000003\n");
  EXPECT_EQ(read_text(checkpoints / "step_00000003" / "model.safetensors"), saved);

  const auto resumed = run_command(mltrain(config + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_CONTAINS(resumed.output, "resuming from " + (checkpoints / "step_00000003").string());
  const auto unbroken =
      run_command(mltrain(nine_steps(dir) + " --set train.run_dir=" + (dir / "unbroken").string()));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  expect_same_checkpoint(checkpoints / "step_00000009",
                         dir / "unbroken" / "checkpoints" / "step_00000009");
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006.tmp"));
}

// The moments of SaveMoment: the weights written, every file written, the directory renamed with
// `latest` not yet updated.
INSTANTIATE_TEST_SUITE_P(AtEachMoment, KilledDuringABackgroundWrite,
                         ::testing::Values("weights", "files", "renamed"));

TEST(AsyncCheckpoints, AFailedBackgroundWriteEndsTheRunAndKeepsThePreviousCheckpoint) {
  TemporaryDirectory dir;
  const std::string config = nine_steps(dir) + kAsync;
  ASSERT_EQ(run_command(mltrain(config + " --set train.stop_at=3")).exit_code, 0);
  const auto failed =
      run_command(mltrain_with_fault("fail-checkpoint-write", config + " --resume auto"));
  EXPECT_EQ(failed.exit_code, kExitRuntimeFailure) << failed.output;
  EXPECT_CONTAINS(failed.output, "saving the checkpoint of step 6 failed");
  EXPECT_CONTAINS(failed.output, "No space left on device");
  const auto checkpoints = dir / "run" / "checkpoints";
  EXPECT_EQ(read_text(checkpoints / "latest"), "step_00000003\n");
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006.tmp"));
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006"));
}

// On two ranks a failed background write of rank 0 ends both ranks at once, through the next
// step's stop vote, instead of leaving rank 1 in a collective until dist.timeout_s.
TEST(AsyncCheckpoints, AFailedBackgroundWriteEndsEveryRank) {
  TemporaryDirectory dir;
  const std::string config = nine_steps(dir) + kAsync + " --set dist.timeout_s=120";
  const auto start = std::chrono::steady_clock::now();
  const auto failed = run_command(testing::mpirun_with_fault(2, "fail-checkpoint-write", config));
  EXPECT_EQ(failed.exit_code, kExitRuntimeFailure) << failed.output;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0)
      << "rank 1 waited for the timeout";
  EXPECT_CONTAINS(failed.output, "No space left on device");
  EXPECT_CONTAINS(failed.output, "another rank could not write a checkpoint (its log says why)");
}

// A rank that cannot write its share of a checkpoint (at stage 3 each rank writes its own parts)
// ends every rank at once, whether it writes here or in the background, and its reason is said;
// nothing is left of that save, and the checkpoint before stays the newest.
TEST(AsyncCheckpoints, ARankThatCannotWriteItsShareEndsEveryRankAndKeepsThePreviousCheckpoint) {
  for (const std::string mode : {"", kAsync}) {
    TemporaryDirectory dir;
    const std::string config =
        nine_steps(dir) + mode + " --set dist.zero_stage=3 --set dist.timeout_s=120";
    const auto first =
        run_command(testing::mpirun(2) + " " + testing::mltrain(config) + " --set train.stop_at=3");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const auto start = std::chrono::steady_clock::now();
    const auto failed =
        run_command(testing::mpirun_with_fault(2, "fail-share-write:1", config + " --resume auto"));
    EXPECT_EQ(failed.exit_code, kExitRuntimeFailure) << mode << failed.output;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0)
        << mode << ": a rank waited for the timeout";
    EXPECT_CONTAINS(failed.output, "rank 1 cannot write");
    EXPECT_CONTAINS(failed.output, "No space left on device (injected)");
    const auto checkpoints = dir / "run" / "checkpoints";
    EXPECT_EQ(read_text(checkpoints / "latest"), "step_00000003\n") << mode;
    EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006.tmp")) << mode;
    EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006")) << mode;
  }
}

// A stop waits for its checkpoint's write: the run says where to continue only once it is there.
TEST(AsyncCheckpoints, AStopWaitsForTheWrite) {
  TemporaryDirectory dir;
  testing::BackgroundProcess run(mltrain(write_config(dir, 1000000) + kAsync), dir / "log.txt");
  testing::wait_for_step(dir / "run" / "metrics.jsonl", 3);
  run.signal(SIGTERM);
  ASSERT_EQ(run.wait(), 0) << read_text(dir / "log.txt");
  const std::string log = read_text(dir / "log.txt");
  const int64_t stopped = testing::latest_step(dir / "run");
  const std::string checkpoint =
      (dir / "run" / "checkpoints" / fmt::format("step_{:08d}", stopped)).string();
  EXPECT_CONTAINS(log, "stopped by Terminated after step " + std::to_string(stopped) +
                           "; continue with --resume auto (or --resume " + checkpoint + ")");
  EXPECT_LT(log.find("checkpoint: " + checkpoint), log.find("stopped by Terminated"));
  const auto evaluated = run_command(mltrain("--eval-only --resume " + checkpoint));
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.output;
}

}  // namespace
}  // namespace mltrain
