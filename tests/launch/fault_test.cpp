// What signals, crashes, full disks and diverging runs leave behind, with mltrain run as a user
// runs it. Failures are made on purpose by mltrain_faults, a test-only build of mltrain that reads
// MLTRAIN_FAULT (tests/launch/mltrain_with_faults.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "model/interop/safetensors.h"
#include "tests/launch/fault_support.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::mltrain;
using testing::mltrain_with_fault;
using testing::run_command;
using testing::TemporaryDirectory;
using testing::wait_for_step;
using testing::write_config;

void expect_same_weights(const std::filesystem::path& a, const std::filesystem::path& b) {
  const NamedTensors first = load_safetensors(a);
  const NamedTensors second = load_safetensors(b);
  for (const auto& [name, tensor] : first) EXPECT_TRUE(at::equal(tensor, second.at(name))) << name;
}

constexpr int64_t kGlobalBatch = 16;  // the tiny run's windows per step

// A run directory at `run_dir` whose only checkpoint is a copy of `checkpoint`, to be resumed at
// sample `samples` instead of the checkpoint's own (its state.json edited: the file holds no
// checksum of itself): as a run that went on past the samples behind skipped steps does.
void resume_at_sample(const std::filesystem::path& checkpoint, const std::filesystem::path& run_dir,
                      int64_t samples) {
  const std::filesystem::path copy = run_dir / "checkpoints" / checkpoint.filename();
  std::filesystem::create_directories(copy.parent_path());
  std::filesystem::copy(checkpoint, copy);
  nlohmann::json state = nlohmann::json::parse(testing::read_text(copy / "state.json"));
  state["samples_consumed"] = samples;
  testing::write_text(copy / "state.json", state.dump());
  testing::write_text(run_dir / "checkpoints" / "latest", checkpoint.filename().string() + "\n");
}

// The records of metrics.jsonl since its last start event: the last run's.
std::vector<nlohmann::json> last_run_records(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> records;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "start") records.clear();
    records.push_back(std::move(record));
  }
  return records;
}

TEST(Faults, SigtermCheckpointsExitsZeroAndResumesToTheUnbrokenWeights) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000);
  testing::BackgroundProcess run(mltrain(endless), dir / "log.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  run.signal(SIGTERM);
  ASSERT_EQ(run.wait(), 0) << testing::read_text(dir / "log.txt");
  EXPECT_CONTAINS(testing::read_text(dir / "log.txt"), "stopped by Terminated");
  const int64_t stopped = testing::latest_step(dir / "run");
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

// A closed terminal (SIGHUP) stops a run as SIGTERM does, with a checkpoint; under nohup, which
// asks that it not, the run goes on.
TEST(Faults, AHangupCheckpointsUnlessTheRunWasStartedUnderNohup) {
  TemporaryDirectory dir;
  const std::string endless = write_config(dir, 1000000);
  testing::BackgroundProcess run(mltrain(endless), dir / "log.txt");
  wait_for_step(dir / "run" / "metrics.jsonl", 3);
  run.signal(SIGHUP);
  ASSERT_EQ(run.wait(), 0) << testing::read_text(dir / "log.txt");
  EXPECT_CONTAINS(testing::read_text(dir / "log.txt"), "stopped by Hangup");
  EXPECT_GE(testing::latest_step(dir / "run"), 3);

  const auto nohup_dir = dir / "nohup";
  testing::BackgroundProcess immune(
      "nohup " + mltrain(endless + " --set train.run_dir=" + nohup_dir.string()),
      dir / "nohup.txt");
  wait_for_step(nohup_dir / "metrics.jsonl", 3);
  immune.signal(SIGHUP);
  const int64_t hung_up_at = testing::last_logged_step(nohup_dir / "metrics.jsonl");
  wait_for_step(nohup_dir / "metrics.jsonl", hung_up_at + 3);
  EXPECT_GE(testing::last_logged_step(nohup_dir / "metrics.jsonl"), hung_up_at + 3)
      << testing::read_text(dir / "nohup.txt");
  immune.signal(SIGTERM);
  ASSERT_EQ(immune.wait(), 0) << testing::read_text(dir / "nohup.txt");
  EXPECT_CONTAINS(testing::read_text(dir / "nohup.txt"), "stopped by Terminated");
}

// `mltrain ... | tee log`, and Ctrl-C: tee goes first, and the run, writing to a pipe that nobody
// reads any more, must still stop with its checkpoint rather than die of SIGPIPE.
TEST(Faults, ALogReaderThatGoesAwayDoesNotEndTheRun) {
  TemporaryDirectory dir;
  const std::string script = fmt::format(
      "cd {} && mkfifo log.pipe && (head -c 1 < log.pipe > /dev/null &) && "
      "{{ {} > log.pipe 2>&1 & }} && pid=$! && "
      "for i in $(seq 1200); do grep -q '\"step\":3,' run/metrics.jsonl 2>/dev/null && break; "
      "sleep 0.05; done; kill -TERM $pid; wait $pid; echo exit=$?",
      dir.path().string(), mltrain(write_config(dir, 1000000)));
  const auto result = run_command(script);
  EXPECT_CONTAINS(result.output, "exit=0");
  EXPECT_GE(testing::latest_step(dir / "run"), 3);
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

// Muon's momentum is in the checkpoint: a Muon run killed (kill -9) while it saves, and resumed,
// ends with the weights and the optimizer state of the unbroken run, bit for bit. A resume that
// asks for another optimizer is refused in one line (exit 2), and changes nothing.
TEST(Faults, AMuonRunKilledWhileSavingResumesBitwise) {
  TemporaryDirectory dir;
  const std::string config =
      write_config(dir, 9) + " --set train.ckpt_every=3 --set optim.name=muon";
  ASSERT_EQ(run_command(mltrain(config + " --set train.stop_at=3")).exit_code, 0);
  const auto killed =
      run_command(mltrain_with_fault("kill-during-checkpoint", config + " --resume auto"));
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  const auto resumed = run_command(mltrain(config + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_CONTAINS(resumed.output, "optimizer: Muon");
  const auto unbroken =
      run_command(mltrain(config + " --set train.run_dir=" + (dir / "unbroken").string()));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  const std::filesystem::path last = dir / "run" / "checkpoints" / "step_00000009";
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(file);
    expect_same_weights(last / file, dir / "unbroken" / "checkpoints" / "step_00000009" / file);
  }
  EXPECT_TRUE(load_safetensors(last / "optimizer.safetensors")
                  .contains("model.layers.0.self_attn.q_proj.weight.momentum"));

  const std::string saved = testing::read_text(last / "optimizer.safetensors");
  const auto other = run_command(
      mltrain(config + " --resume auto --set train.max_steps=12 --set optim.name=adamw"));
  EXPECT_EQ(other.exit_code, kExitUserError) << other.output;
  EXPECT_CONTAINS(other.output,
                  "the checkpoint holds the optimizer state of muon, and this run asks for adamw "
                  "(optim.name): resume with --set optim.name=muon");
  EXPECT_EQ(other.output.find("is intact"), std::string::npos)
      << "an older checkpoint holds the same optimizer's state: it is no way out";
  EXPECT_EQ(testing::read_text(dir / "run" / "checkpoints" / "latest"), "step_00000009\n");
  EXPECT_EQ(testing::read_text(last / "optimizer.safetensors"), saved);
}

// Two ranks at stage 3, killed (kill -9) while rank 0 saves, resume and end with the weights and
// the optimizer state of an unbroken run of two ranks at stage 3, bit for bit.
TEST(Faults, AStageThreeRunKilledWhileSavingResumesBitwise) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 9) +
                             " --set train.ckpt_every=3 --set data.micro_batch=4"
                             " --set dist.zero_stage=3";
  const std::string two_ranks = testing::mpirun(2) + " " + MLTRAIN_BIN_DIR + "/mltrain ";
  ASSERT_EQ(run_command(two_ranks + config + " --set train.stop_at=3").exit_code, 0);
  const auto killed = run_command(
      testing::mpirun_with_fault(2, "kill-during-checkpoint", config + " --resume auto"));
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  // Killed while saving step 6, not before it.
  const std::filesystem::path checkpoints = dir / "run" / "checkpoints";
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000006.tmp")) << killed.output;
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000006")) << killed.output;
  const auto resumed = run_command(two_ranks + config + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto unbroken =
      run_command(two_ranks + config + " --set train.run_dir=" + (dir / "unbroken").string());
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  const std::filesystem::path last = std::filesystem::path("checkpoints") / "step_00000009";
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(file);
    expect_same_weights(dir / "run" / last / file, dir / "unbroken" / last / file);
  }
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

// A loss spike (10 times the step's loss, injected) is not applied, with either optimizer: the
// weights and the optimizer's state after the step that follows it are those of a run that skips
// the spiking step's samples, the log and metrics.jsonl say so, and the checkpoint due at the
// skipped step waits for the next step that is applied. Spikes that go on after a rollback stop
// the run, naming the last good checkpoint.
TEST(Faults, ALossSpikeIsSkippedAndLeavesTheStateUntouched) {
  TemporaryDirectory dir;
  const std::string config =
      write_config(dir, 9) +
      " --set train.ckpt_every=1 --set train.keep_last=10 --set train.max_bad_steps=3";
  for (const std::string optimizer : {"adamw", "muon"}) {
    SCOPED_TRACE(optimizer);
    const std::filesystem::path run_dir = dir / optimizer;
    const std::string run_config = config + " --set optim.name=" + optimizer;
    const auto run = run_command(mltrain_with_fault(
        "spike-loss:7-7", run_config + " --set train.run_dir=" + run_dir.string()));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_CONTAINS(run.output, "step 7: loss ");
    EXPECT_CONTAINS(run.output, "times its running level");
    EXPECT_CONTAINS(run.output, "(train.spike_guard = 2): update skipped (1 in a row");
    EXPECT_CONTAINS(run.output,
                    "step 7: the checkpoint waits for the next step that is applied (1 skipped");
    EXPECT_EQ(run.output.find("step 6: loss"), std::string::npos) << run.output;
    const std::filesystem::path checkpoints = run_dir / "checkpoints";
    EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000007"));

    // Step 6's checkpoint, trained one step on the samples of step 8: step 7 left no trace.
    const std::filesystem::path skipping = dir / (optimizer + "_skipping");
    resume_at_sample(checkpoints / "step_00000006", skipping, 7 * kGlobalBatch);
    const auto skipped = run_command(mltrain(run_config +
                                             " --resume auto --set train.max_steps=7 "
                                             "--set train.run_dir=" +
                                             skipping.string()));
    ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      SCOPED_TRACE(file);
      expect_same_weights(checkpoints / "step_00000008" / file,
                          skipping / "checkpoints" / "step_00000007" / file);
    }
    bool recorded = false;
    for (const nlohmann::json& record : last_run_records(run_dir / "metrics.jsonl")) {
      if (record.value("skipped", "") != "loss spike") continue;
      recorded = true;
      EXPECT_EQ(record["step"], 7);
      EXPECT_GT(record["loss"].get<double>(), 2 * record["loss_level"].get<double>());
    }
    EXPECT_TRUE(recorded);
  }

  const std::filesystem::path spiking_dir = dir / "spiking";
  const auto spiking = run_command(mltrain_with_fault(
      "spike-loss:4-100", write_config(dir, 20) +
                              " --set train.ckpt_every=2 --set train.max_bad_steps=3 --set "
                              "train.run_dir=" +
                              spiking_dir.string()));
  EXPECT_EQ(spiking.exit_code, kExitRuntimeFailure) << spiking.output;
  const std::string good = (spiking_dir / "checkpoints" / "step_00000002").string();
  EXPECT_CONTAINS(spiking.output,
                  "step 6: 3 skipped steps in a row (the last a loss spike): rolled back to " +
                      good + " (step 2)");
  EXPECT_CONTAINS(spiking.output,
                  "step 6: 3 skipped steps in a row (the last a loss spike) again after rolling "
                  "back to step_00000002: stopping, with no checkpoint left to go back to; the "
                  "settings are at fault, not a few samples; the last good checkpoint is " +
                      good);
  EXPECT_FALSE(std::filesystem::exists(spiking_dir / "checkpoints" / "step_00000004"))
      << "no checkpoint is saved while steps are skipped";
}

// The windows of each micro-batch that rank 0 read, from mltrain_faults' print-windows lines, in
// the order it read them: (its step, its windows).
std::vector<std::pair<int64_t, std::string>> windows_read(const std::string& output) {
  std::vector<std::pair<int64_t, std::string>> batches;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    int64_t step = 0;
    int rank = 0;
    char windows[4096] = {};
    if (std::sscanf(line.c_str(), "windows %ld %d: %4095s", &step, &rank, windows) != 3 ||
        rank != 0)
      continue;
    batches.emplace_back(step, windows);
  }
  return batches;
}

// train.max_bad_steps loss spikes in a row (injected at steps 6 to 8, the first time they train)
// roll the run back to its last checkpoint (step 4's, with step 5 applied since), and the run
// trains on past the samples it read since: the step that follows reads the windows that an
// unbroken run reads four steps later, and so on to the end. Its state is the checkpoint's: the
// run ends as one resumed from that checkpoint at that sample ends, bit for bit.
TEST(Faults, RepeatedSpikesRollBackToTheCheckpointAndTrainPastTheirSamples) {
  TemporaryDirectory dir;
  const std::string config =
      write_config(dir, 10) +
      " --set train.ckpt_every=4 --set train.keep_last=10 --set train.max_bad_steps=3";
  const auto unbroken = run_command(mltrain_with_fault(
      "print-windows",
      config + " --set train.max_steps=14 --set train.run_dir=" + (dir / "unbroken").string()));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  const auto run = run_command(mltrain_with_fault("spike-loss-once:6-8,print-windows", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output,
                  "step 8: 3 skipped steps in a row (the last a loss spike): rolled back to");

  // The tiny run takes 2 micro-batches a step: the unbroken run reads 14 steps' worth, the
  // other steps 1 to 8, then 5 to 10.
  const auto expected = windows_read(unbroken.output);
  const auto read = windows_read(run.output);
  ASSERT_EQ(expected.size(), 28u) << unbroken.output;
  ASSERT_EQ(read.size(), 28u) << run.output;
  for (size_t i = 0; i < read.size(); ++i) {
    const auto unbroken_step = static_cast<int64_t>(i / 2 + 1);
    EXPECT_EQ(read[i].first, i < 16 ? unbroken_step : unbroken_step - 4) << "batch " << i;
    EXPECT_EQ(read[i].second, expected[i].second)
        << "batch " << i << " reads what the unbroken run's step " << unbroken_step << " reads";
  }

  bool recorded = false;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.value("event", "") != "rollback") continue;
    recorded = true;
    EXPECT_EQ(record["step"], 8);
    EXPECT_EQ(record["to_step"], 4);
    EXPECT_EQ(record["samples_left_out"], 4 * kGlobalBatch);
  }
  EXPECT_TRUE(recorded);

  // Step 4's checkpoint, resumed at the sample where the rollback went on.
  resume_at_sample(dir / "run" / "checkpoints" / "step_00000004", dir / "resumed",
                   8 * kGlobalBatch);
  const auto resumed_run = run_command(
      mltrain(config + " --resume auto --set train.run_dir=" + (dir / "resumed").string()));
  ASSERT_EQ(resumed_run.exit_code, 0) << resumed_run.output;
  const std::filesystem::path last = std::filesystem::path("checkpoints") / "step_00000010";
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(file);
    expect_same_weights(dir / "run" / last / file, dir / "resumed" / last / file);
  }

  // Two ranks sharing the global batch, their optimizer state sharded (and at stage 3 their
  // weights, which the rollback fills a unit at a time), roll back together: they end with
  // the weights of the one rank.
  const NamedTensors one_rank_weights = load_safetensors(dir / "run" / last / "model.safetensors");
  for (const int stage : {1, 3}) {
    const std::filesystem::path run_dir = dir / fmt::format("two_ranks_at_{}", stage);
    const auto two_ranks = run_command(testing::mpirun_with_fault(
        2, "spike-loss-once:6-8",
        config + fmt::format(" --set data.micro_batch=4 --set dist.zero_stage={}", stage) +
            " --set train.run_dir=" + run_dir.string()));
    ASSERT_EQ(two_ranks.exit_code, 0) << two_ranks.output;
    const NamedTensors two_rank_weights = load_safetensors(run_dir / last / "model.safetensors");
    for (const auto& [name, tensor] : one_rank_weights)
      EXPECT_LE(testing::relative_error(two_rank_weights.at(name), tensor),
                stage == 1 ? 1e-5 : 2e-5)
          << "stage " << stage << ": " << name;
  }
}

// A run resumed from an older checkpoint of its directory rolls back to that one, its own, not to
// the newer one that `latest` names (left by the run it branched from).
TEST(Faults, ARollbackGoesToTheRunsOwnCheckpointNotTheNewestInTheDirectory) {
  TemporaryDirectory dir;
  const std::string config =
      write_config(dir, 8) +
      " --set train.ckpt_every=4 --set train.keep_last=10 --set train.max_bad_steps=3";
  ASSERT_EQ(run_command(mltrain(config)).exit_code, 0);
  const std::filesystem::path checkpoints = dir / "run" / "checkpoints";
  const auto branched = run_command(mltrain_with_fault(
      "spike-loss-once:5-7", config + " --resume " + (checkpoints / "step_00000004").string()));
  ASSERT_EQ(branched.exit_code, 0) << branched.output;
  EXPECT_CONTAINS(branched.output,
                  "step 7: 3 skipped steps in a row (the last a loss spike): rolled back to " +
                      (checkpoints / "step_00000004").string() + " (step 4)");
}

// Steps that are skipped whatever checkpoint the run goes back to stop it: the checkpoint whose
// weights gave only skipped steps when gone back to is set aside as bad, the rollbacks go back
// further, and the run fails (exit 1) naming the last good checkpoint, which `latest` names. A
// few samples that spike at the end of a run roll it back to its last checkpoint, past them, and
// it finishes: its last step is never saved while skipped.
TEST(Faults, StepsSkippedAfterEveryRollbackStopTheRunAtTheLastGoodCheckpoint) {
  TemporaryDirectory dir;
  const std::string config =
      write_config(dir, 8) + " --set train.ckpt_every=2 --set train.max_bad_steps=3";
  const auto failed = run_command(mltrain_with_fault("nonfinite-gradients:5-101", config));
  EXPECT_EQ(failed.exit_code, kExitRuntimeFailure) << failed.output;
  const std::filesystem::path checkpoints = dir / "run" / "checkpoints";
  EXPECT_CONTAINS(failed.output, "rolled back to " + (checkpoints / "step_00000004").string());
  EXPECT_CONTAINS(failed.output,
                  "again after rolling back to step_00000004, step_00000002: "
                  "stopping, with no checkpoint left to go back to");
  EXPECT_CONTAINS(failed.output,
                  "the last good checkpoint is " + (checkpoints / "step_00000002").string());
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000004.bad-1" / "state.json"));
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000008"));
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000002\n");

  // Two ranks, their optimizer state sharded, decide alike from rank 0's list of checkpoints:
  // the same rollbacks, the same checkpoint set aside, the same stop.
  const std::filesystem::path two_ranks = dir / "two_ranks";
  const auto both = run_command(testing::mpirun_with_fault(
      2, "nonfinite-gradients:5-101",
      config + " --set data.micro_batch=4 --set dist.zero_stage=1 --set train.run_dir=" +
          two_ranks.string()));
  EXPECT_NE(both.exit_code, 0) << both.output;
  EXPECT_CONTAINS(both.output,
                  "again after rolling back to step_00000004, step_00000002: "
                  "stopping, with no checkpoint left to go back to");
  EXPECT_TRUE(
      std::filesystem::exists(two_ranks / "checkpoints" / "step_00000004.bad-1" / "state.json"));
  EXPECT_EQ(testing::read_text(two_ranks / "checkpoints" / "latest"), "step_00000002\n");

  const std::filesystem::path few = dir / "few";
  const auto finished = run_command(
      mltrain_with_fault("spike-loss-once:7-8", config + " --set train.run_dir=" + few.string()));
  EXPECT_EQ(finished.exit_code, 0) << finished.output;
  EXPECT_CONTAINS(finished.output,
                  "step 8: 2 skipped steps in a row at the run's last step: rolled back to " +
                      (few / "checkpoints" / "step_00000006").string());
  EXPECT_TRUE(std::filesystem::exists(few / "checkpoints" / "step_00000008" / "state.json"));
}

// Issue 43's bad streak: a run resumed with a learning rate that wrecks the weights in one update
// (its loss, taken before the update, is finite and passes the spike guard), after which every
// step is skipped. No checkpoint is saved while steps are skipped; one saved just after the
// update (train.ckpt_every 1) is tried, found bad and set aside, and train.keep_last 1 never
// prunes the checkpoint before it; the rollbacks go back further each time the trouble comes
// back; the run stops naming as the last good checkpoint the one it resumed from, which `latest`
// names, and from which the run's own learning rate trains on with finite losses.
TEST(Faults, ADestructiveUpdateLeavesTheLastGoodCheckpointToResumeFrom) {
  for (const int64_t ckpt_every : {2, 1}) {
    SCOPED_TRACE(ckpt_every);
    TemporaryDirectory dir;
    const std::string config = write_config(dir, 8) +
                               " --set train.ckpt_every=" + std::to_string(ckpt_every) +
                               " --set train.keep_last=" + std::to_string(ckpt_every);
    ASSERT_EQ(run_command(mltrain(config)).exit_code, 0);
    const std::filesystem::path checkpoints = dir / "run" / "checkpoints";
    const auto wrecked =
        run_command(mltrain(config + " --resume auto --set optim.lr=1e6 --set train.max_steps=40"));
    EXPECT_EQ(wrecked.exit_code, kExitRuntimeFailure) << wrecked.output;
    EXPECT_CONTAINS(wrecked.output,
                    "the last good checkpoint is " + (checkpoints / "step_00000008").string() +
                        ": continue from it with --resume auto once they are fixed");
    EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000008\n");
    if (ckpt_every == 1) {
      EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000009.bad-1" / "state.json"));
    }

    const auto resumed = run_command(mltrain(config + " --resume auto --set train.max_steps=14"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    int64_t steps = 0;
    for (const nlohmann::json& record : last_run_records(dir / "run" / "metrics.jsonl")) {
      EXPECT_FALSE(record.contains("skipped")) << record.dump();
      if (!record.contains("loss")) continue;
      ++steps;
      EXPECT_TRUE(std::isfinite(record["loss"].get<double>())) << record.dump();
    }
    EXPECT_EQ(steps, 6);
  }
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
  EXPECT_CONTAINS(diverging.output, "step 6: 3 non-finite steps in a row: rolled back to");
  EXPECT_CONTAINS(diverging.output,
                  "step 6: 3 non-finite steps in a row again after rolling back to "
                  "step_00000002: stopping, with no checkpoint left to go back to");
}

}  // namespace
}  // namespace mltrain
