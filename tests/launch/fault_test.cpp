// What signals, crashes, full disks and diverging runs leave behind, with mltrain run as a user
// runs it. Failures are made on purpose by mltrain_faults, a test-only build of mltrain that reads
// MLTRAIN_FAULT (tests/launch/mltrain_with_faults.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "model/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::run_command;
using testing::TemporaryDirectory;

// A config file for the tiny run, with a constant schedule so that runs of different lengths
// share their learning rates step by step.
std::string write_config(const TemporaryDirectory& dir, int64_t max_steps) {
  Config config = testing::tiny_run(dir.path());
  config.optim.schedule = "constant";
  config.train.max_steps = max_steps;
  config.train.log_every = 1;
  config.train.eval_every = 1000000;
  const auto path = dir / "run.yaml";
  testing::write_text(path, config_to_yaml(config));
  return path.string();
}

std::string mltrain(const std::string& arguments) {
  return std::string(MLTRAIN_BIN_DIR) + "/mltrain " + arguments;
}

// mltrain_faults with MLTRAIN_FAULT=fault.
std::string mltrain_with_fault(const std::string& fault, const std::string& arguments) {
  return "MLTRAIN_FAULT=" + fault + " " + std::string(MLTRAIN_BIN_DIR) + "/mltrain_faults " +
         arguments;
}

int64_t last_logged_step(const std::filesystem::path& metrics) {
  int64_t step = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.contains("loss")) step = record["step"];
  }
  return step;
}

void wait_for_step(const std::filesystem::path& metrics, int64_t step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (last_logged_step(metrics) < step && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void expect_same_weights(const std::filesystem::path& a, const std::filesystem::path& b) {
  const NamedTensors first = load_safetensors(a);
  const NamedTensors second = load_safetensors(b);
  for (const auto& [name, tensor] : first) EXPECT_TRUE(at::equal(tensor, second.at(name))) << name;
}

TEST(Faults, SigtermCheckpointsExitsZeroAndResumesToTheUnbrokenWeights) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000);
  testing::BackgroundProcess run(mltrain(endless), dir / "log.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  run.signal(SIGTERM);
  ASSERT_EQ(run.wait(), 0) << testing::read_text(dir / "log.txt");
  EXPECT_CONTAINS(testing::read_text(dir / "log.txt"), "stopped by Terminated");
  const int64_t stopped =
      std::stoll(testing::read_text(dir / "run" / "checkpoints" / "latest").substr(5));
  ASSERT_GE(stopped, 3);

  const std::string target = std::to_string(stopped + 4);
  const auto resumed =
      run_command(mltrain(endless + " --resume auto --set train.max_steps=" + target));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto unbroken = run_command(mltrain(endless + " --set train.max_steps=" + target +
                                            " --set train.run_dir=" + (dir / "unbroken").string()));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  const std::string last = "step_" + std::string(8 - target.size(), '0') + target;
  expect_same_weights(dir / "run" / "checkpoints" / last / "model.safetensors",
                      dir / "unbroken" / "checkpoints" / last / "model.safetensors");
}

TEST(Faults, SecondInterruptExitsAtOnce) {
  TemporaryDirectory dir;
  // Steps long enough for the second interrupt to land inside the step the first one waits for.
  testing::BackgroundProcess run(
      mltrain(write_config(dir, 1000000) +
              " --set model.d_model=256 --set model.d_ffn=1024 --set data.micro_batch=64"),
      dir / "log.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 2);
  run.signal(SIGINT);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (testing::read_text(dir / "log.txt").find("interrupt again") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  run.signal(SIGINT);
  EXPECT_EQ(run.wait(), 130) << testing::read_text(dir / "log.txt");
  EXPECT_CONTAINS(testing::read_text(dir / "log.txt"),
                  "second interrupt: exiting without a checkpoint");
}

TEST(Faults, KillDuringACheckpointWriteKeepsThePreviousOne) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 6) + " --set train.ckpt_every=3";
  ASSERT_EQ(run_command(mltrain(config + " --set train.stop_at=3")).exit_code, 0);
  const auto checkpoints = dir / "run" / "checkpoints";
  const std::string saved = testing::read_text(checkpoints / "step_00000003" / "model.safetensors");

  const auto killed =
      run_command(mltrain_with_fault("kill-during-checkpoint", config + " --resume auto"));
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000006.tmp"));
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006"));
  EXPECT_EQ(testing::read_text(checkpoints / "step_00000003" / "model.safetensors"), saved);

  const auto resumed = run_command(mltrain(config + " --resume auto"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_CONTAINS(resumed.output, "resuming from");
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006.tmp"));
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000006" / "state.json"));
}

TEST(Faults, FailingCheckpointWriteExitsOneAndKeepsThePreviousOne) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 6) + " --set train.ckpt_every=3";
  ASSERT_EQ(run_command(mltrain(config + " --set train.stop_at=3")).exit_code, 0);
  const auto failed =
      run_command(mltrain_with_fault("fail-checkpoint-write", config + " --resume auto"));
  EXPECT_EQ(failed.exit_code, kExitRuntimeFailure);
  EXPECT_CONTAINS(failed.output, "saving the checkpoint of step 6 failed");
  EXPECT_CONTAINS(failed.output, "No space left on device");
  const auto checkpoints = dir / "run" / "checkpoints";
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000003\n");
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006.tmp"));
}

TEST(Faults, TheShippedBinaryHasNoFaultSwitch) {
  TemporaryDirectory dir;
  const auto run = run_command("MLTRAIN_FAULT=fail-checkpoint-write,nonfinite-gradients:1-100 " +
                               mltrain(write_config(dir, 6)));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("skipped"), std::string::npos) << run.output;
  EXPECT_TRUE(
      std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000006" / "state.json"));
}

TEST(Faults, NonFiniteStepsAreSkippedThenStopTheRun) {
  TemporaryDirectory dir;
  const std::string config =
      write_config(dir, 8) + " --set train.ckpt_every=2 --set train.max_bad_steps=3";
  const auto one_bad = run_command(mltrain_with_fault("nonfinite-gradients:5-5", config));
  EXPECT_EQ(one_bad.exit_code, 0) << one_bad.output;
  EXPECT_CONTAINS(one_bad.output, "step 5: non-finite loss");
  EXPECT_CONTAINS(one_bad.output, "update skipped");
  const NamedTensors weights =
      load_safetensors(dir / "run" / "checkpoints" / "step_00000008" / "model.safetensors");
  for (const auto& [name, tensor] : weights)
    EXPECT_TRUE(at::isfinite(tensor).all().item<bool>()) << name;

  const auto diverging = run_command(
      mltrain_with_fault("nonfinite-gradients:4-101",
                         config + " --set train.run_dir=" + (dir / "diverging").string()));
  EXPECT_EQ(diverging.exit_code, kExitRuntimeFailure);
  EXPECT_CONTAINS(diverging.output,
                  "3 non-finite steps in a row: stopping; the last good checkpoint is");
  EXPECT_CONTAINS(diverging.output,
                  "step_00000004");  // skipped steps leave the weights as they were
}

TEST(Faults, ARankThatDiesStopsTheOthers) {
  TemporaryDirectory dir;
  const auto start = std::chrono::steady_clock::now();
  const auto run =
      run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                  std::string(MLTRAIN_MPIEXEC) + " 2 -x MLTRAIN_FAULT=kill-rank-1 " +
                  std::string(MLTRAIN_BIN_DIR) + "/mltrain_faults " + write_config(dir, 1000000));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(seconds, 60.0) << "the surviving rank must not wait for the dead one";
}

TEST(Faults, RanksThatDisagreeStopBeforeTraining) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 8);
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MLTRAIN_MPIEXEC);
  // Two ranks started with different overrides (mpirun's multiple-program syntax).
  const auto mismatch = run_command(mpirun + " 1 " + mltrain(config + " --set optim.lr=1e-3") +
                                    " : -n 1 " + mltrain(config + " --set optim.lr=2e-3"));
  EXPECT_EQ(mismatch.exit_code, kExitUserError) << mismatch.output;
  EXPECT_CONTAINS(mismatch.output, "the ranks were given different configs");
  const auto backend = run_command(mpirun + " 2 " + mltrain(config + " --set dist.backend=nccl"));
  EXPECT_EQ(backend.exit_code, kExitUserError) << backend.output;
  EXPECT_CONTAINS(backend.output, "dist.backend nccl needs CUDA training");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints"));
}

TEST(Faults, ARankThatHangsEndsTheRunAfterTheTimeout) {
  TemporaryDirectory dir;
  const auto start = std::chrono::steady_clock::now();
  const auto run = run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                               std::string(MLTRAIN_MPIEXEC) + " 2 -x MLTRAIN_FAULT=hang-rank-1 " +
                               std::string(MLTRAIN_BIN_DIR) + "/mltrain_faults " +
                               write_config(dir, 1000000) + " --set dist.timeout_s=5");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "did not finish within dist.timeout_s = 5 s");
  EXPECT_LT(seconds, 60.0);
}

}  // namespace
}  // namespace mltrain
