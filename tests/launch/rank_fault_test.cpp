// Runs of several ranks under mpirun on the CPU, when a rank dies, hangs or disagrees, and when the
// person at the terminal stops them. Failures are made on purpose by mltrain_faults
// (tests/launch/mltrain_with_faults.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <regex>

#include "common/error.h"
#include "tests/launch/fault_support.h"
#include "tests/support/test_support.h"
#include "trainer/checkpoint/checkpoint_format.h"

namespace mltrain {
namespace {

using testing::mpirun;
using testing::mpirun_with_fault;
using testing::run_command;
using testing::TemporaryDirectory;
using testing::write_config;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The survivors do not wait for a dead rank; Open MPI then signals them (SIGTERM, then SIGKILL):
// they may not say that they will checkpoint, which they cannot.
TEST(RankFaults, ARankThatDiesStopsTheOthers) {
  TemporaryDirectory dir;
  const auto start = std::chrono::steady_clock::now();
  const auto run = run_command(mpirun_with_fault(2, "kill-rank:1", write_config(dir, 1000000)));
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(seconds_since(start), 60.0) << "the surviving rank must not wait for the dead one";
  EXPECT_EQ(run.output.find("checkpointing after this step"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("stopped by"), std::string::npos) << run.output;
}

TEST(RankFaults, RanksThatDisagreeStopBeforeTraining) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 8);
  // Two ranks started with different overrides (mpirun's multiple-program syntax).
  const auto mismatch =
      run_command(mpirun(1) + " " + testing::mltrain(config + " --set optim.lr=1e-3") + " : -n 1 " +
                  testing::mltrain(config + " --set optim.lr=2e-3"));
  EXPECT_EQ(mismatch.exit_code, kExitUserError) << mismatch.output;
  EXPECT_CONTAINS(mismatch.output, "the ranks were given different configs");
  const auto backend =
      run_command(mpirun(2) + " " + testing::mltrain(config + " --set dist.backend=nccl"));
  EXPECT_EQ(backend.exit_code, kExitUserError) << backend.output;
  EXPECT_CONTAINS(backend.output, "dist.backend nccl needs CUDA training");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints"));
}

// A rank that hangs, whichever it is, ends the run within dist.timeout_s and the few seconds of
// Open MPI's kill (the README's margin): the rank that gives up does not wait again for the votes
// it had in flight with the hung one.
TEST(RankFaults, ARankThatHangsEndsTheRunWithinTheTimeout) {
  constexpr double kTimeout = 10;
  // About 3 s on an idle machine: MPI_Abort, then Open MPI's SIGTERM and SIGKILL a second apart.
  // Without the fix, a second timeout (10 s) came on top.
  constexpr double kMargin = 8;
  for (const int hung : {0, 1}) {
    TemporaryDirectory dir;
    const std::string log = (dir / "log.txt").string();
    testing::BackgroundProcess run(
        mpirun_with_fault(2, fmt::format("hang-rank:{}", hung),
                          write_config(dir, 1000000) + " --set dist.timeout_s=10"),
        log);
    const std::string hangs = fmt::format("rank {} hangs", hung);
    testing::wait_until([&] { return testing::read_text(log).find(hangs) != std::string::npos; });
    const auto start = std::chrono::steady_clock::now();
    EXPECT_NE(run.wait(), 0) << testing::read_text(log);
    EXPECT_LT(seconds_since(start), kTimeout + kMargin) << "rank " << hung << " hung";
    EXPECT_CONTAINS(testing::read_text(log), "did not finish within dist.timeout_s = 10 s");
    // The hung rank's other threads answer the request for its flight record: the error names it
    // with its last collective.
    EXPECT_CONTAINS(testing::read_text(log),
                    fmt::format("rank {} had not reached it: its last collective was #", hung));
    for (const int rank : {0, 1})
      EXPECT_TRUE(
          std::filesystem::exists(dir / "run" / "flight" / fmt::format("rank_{}.json", rank)));
  }
}

// A rank stopped whole (SIGSTOP: none of its threads runs) under a short dist.timeout_s: the live
// ranks give up, each writes its flight record, and both the error and --flight-report name the
// stopped rank and the collective the others waited in.
TEST(RankFaults, AStoppedRankIsNamedWithTheCollectiveTheOthersWaitedIn) {
  TemporaryDirectory dir;
  const std::string log = (dir / "log.txt").string();
  const auto start = std::chrono::steady_clock::now();
  testing::BackgroundProcess run(
      mpirun_with_fault(3, "stop-rank:1", write_config(dir, 1000000) + " --set dist.timeout_s=4"),
      log);
  const int exit_code = run.wait(std::chrono::seconds(120));
  const std::string output = testing::read_text(log);
  ASSERT_NE(exit_code, 0) << output;
  ASSERT_NE(exit_code, -1) << "the run must end by itself\n" << output;
  // The timeout, the 4 s the failing ranks wait for the stopped one's record, and Open MPI's kill.
  EXPECT_LT(seconds_since(start), 60.0) << output;
  EXPECT_CONTAINS(output, "rank 1 stops");
  EXPECT_CONTAINS(output, "did not finish within dist.timeout_s = 4 s");
  EXPECT_CONTAINS(output,
                  "rank 1 had not reached it: it wrote no flight record (stopped, gone, or not "
                  "sharing the run directory)");
  // Open MPI's kill continues the stopped rank (SIGCONT) before it ends it, so that a record of
  // rank 1 may come after the others': the error and the report name it all the same.
  const std::filesystem::path flight = dir / "run" / "flight";
  EXPECT_TRUE(std::filesystem::exists(flight / "rank_0.json"));
  EXPECT_TRUE(std::filesystem::exists(flight / "rank_2.json"));

  // The error's collective, "the all-reduce of 1 Float values [collective #57 of step 3]", is the
  // one the report says the run stopped at.
  const std::smatch failure = [&] {
    std::smatch match;
    std::regex_search(
        output, match,
        std::regex(
            R"(the (\S+) of (\d+) (\w+) values did not finish[^\[]*\[collective #(\d+) of step (\d+)\])"));
    return match;
  }();
  ASSERT_FALSE(failure.empty()) << output;
  const auto report = run_command(testing::mltrain("--flight-report " + (dir / "run").string()));
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_CONTAINS(report.output, "of 3 ranks in " + flight.string());
  EXPECT_CONTAINS(report.output,
                  fmt::format("the run stopped at #{}, the {} of {} {} values", failure[4].str(),
                              failure[1].str(), failure[2].str(), failure[3].str()));
  EXPECT_CONTAINS(report.output, "rank 1 had not reached it");
  EXPECT_CONTAINS(report.output, fmt::format("(step {}): rank 1", failure[5].str()));
}

// Flight records left by an earlier run of the directory (and its request for them) move to
// flight.previous: the next run neither answers the old request nor mixes its records with them.
TEST(RankFaults, AnEarlierRunsFlightRecordsMoveAside) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 6);
  const std::filesystem::path flight = dir / "run" / "flight";
  std::filesystem::create_directories(flight);
  testing::write_text(flight / "rank_0.json", "an earlier run's record");
  testing::write_text(flight / "dump_requested", R"({"rank": 1, "seq": 9})");
  const auto run = run_command(mpirun(2) + " " + testing::mltrain(config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(testing::read_text(dir / "run" / "flight.previous" / "rank_0.json"),
            "an earlier run's record");
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "flight.previous" / "dump_requested"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(flight),
                          std::filesystem::directory_iterator()),
            1)
      << "no failure, no records: only the run's token";
  EXPECT_TRUE(std::filesystem::exists(flight / "run_token"));
  // A run that left no records leaves flight.previous to the last run that did.
  const auto again = run_command(
      mpirun(2) + " " + testing::mltrain(config + " --resume auto --set train.max_steps=8"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::read_text(dir / "run" / "flight.previous" / "rank_0.json"),
            "an earlier run's record");
}

// What a user put at RUN_DIR/flight.previous or RUN_DIR/flight (a file, not a run's records) is
// moved aside with a warning when the run moves records there, never removed.
TEST(RankFaults, AUsersFileWhereFlightRecordsGoIsKeptAside) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 6);
  const std::filesystem::path run_dir = dir / "run";
  std::filesystem::create_directories(run_dir / "flight");
  testing::write_text(run_dir / "flight" / "rank_0.json", "an earlier run's record");
  testing::write_text(run_dir / "flight.previous", "the user's notes");
  const auto run = run_command(mpirun(2) + " " + testing::mltrain(config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, (run_dir / "flight.previous").string() +
                                  " is not a run's flight records (one of yours?): kept as "
                                  "flight.previous.replaced-1");
  EXPECT_EQ(testing::read_text(run_dir / "flight.previous.replaced-1"), "the user's notes");
  EXPECT_EQ(testing::read_text(run_dir / "flight.previous" / "rank_0.json"),
            "an earlier run's record");

  TemporaryDirectory other;
  const std::filesystem::path other_run = other / "run";
  std::filesystem::create_directories(other_run);
  testing::write_text(other_run / "flight", "the user's file");
  const auto again = run_command(mpirun(2) + " " + testing::mltrain(write_config(other, 6)));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::read_text(other_run / "flight.replaced-1"), "the user's file");
  EXPECT_TRUE(std::filesystem::exists(other_run / "flight" / "run_token"));
}

// Ranks that do not share the run directory (a relative train.run_dir, each rank started in a
// folder of its own, as on nodes with local disks) train on, and the rank that cannot see rank 0's
// says so: its failures could not gather the flight records, nor could it resume. Rank 0 gathers
// each checkpoint and writes it alone, where the ranks would each write their parts into a shared
// one: at stage 3 too, whose weights no rank holds whole between steps.
TEST(RankFaults, ARankThatDoesNotShareTheRunDirectoryIsWarned) {
  for (const int stage : {0, 3}) {
    TemporaryDirectory dir;
    const std::string config = write_config(dir, 6) + " --set train.run_dir=run" +
                               " --set dist.zero_stage=" + std::to_string(stage);
    for (const char* node : {"node0", "node1"}) std::filesystem::create_directories(dir / node);
    const auto run = run_command(mpirun(1) + " -wdir " + (dir / "node0").string() + " " +
                                 testing::mltrain(config) + " : -n 1 -wdir " +
                                 (dir / "node1").string() + " " + testing::mltrain(config));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_CONTAINS(run.output, "rank 1] warning: this rank does not share train.run_dir (" +
                                    (dir / "node1" / "run").string() + ") with rank 0");
    EXPECT_EQ(run.output.find("rank 0] warning: this rank does not share"), std::string::npos)
        << run.output;
    EXPECT_CONTAINS(run.output, "rank 0 gathers each checkpoint and writes it alone");
    EXPECT_TRUE(std::filesystem::exists(dir / "node0" / "run" / "flight" / "run_token"));
    verify_checkpoint(dir / "node0" / "run" / "checkpoints" / "step_00000006");
    EXPECT_FALSE(std::filesystem::exists(dir / "node1" / "run" / "checkpoints"));
  }
}

// Ctrl-C at a terminal reaches the foreground job's process group: launch/local_ranks.sh turns it
// into SIGUSR1 to mpirun, which forwards it to every rank, and the ranks checkpoint and exit 0.
// mpirun's own answer to Ctrl-C kills them too soon to save. Started as the README starts it,
// without Open MPI's variables for root: the script gives them where it runs as root.
TEST(RankFaults, CtrlCOnTheLauncherCheckpointsAndExitsZero) {
  TemporaryDirectory dir;
  const std::string log = (dir / "log.txt").string();
  testing::BackgroundProcess launcher(
      "env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM MLTRAIN_BIN=" MLTRAIN_BIN_DIR
      "/mltrain setsid bash " MLTRAIN_SOURCE_DIR "/launch/local_ranks.sh 2 " +
          write_config(dir, 1000000) + " --set train.threads=1",
      log);
  testing::wait_for_step(dir / "run" / "metrics.jsonl", 3);
  launcher.signal_group(SIGINT);
  ASSERT_EQ(launcher.wait(), 0) << testing::read_text(log);
  EXPECT_CONTAINS(testing::read_text(log), "stopped by User defined signal 1");
  EXPECT_GE(testing::latest_step(dir / "run"), 3);
}

// Ctrl-C on mpirun itself: Open MPI 4 sends the ranks SIGTERM odls_base_sigkill_timeout seconds
// after the interrupt, and SIGKILL as long again after that. Given the seconds to finish a step
// and save, the ranks checkpoint (mpirun itself exits 1: it ended the job). mpirun no longer
// reads the ranks' output meanwhile: a rank that logs a line every few milliseconds fills the pipe
// and blocks, so this run logs every 50 steps.
TEST(RankFaults, CtrlCOnMpirunWithOpenMpisGracePeriodCheckpoints) {
  if (run_command("ompi_info --param odls base --level 9 | grep -q sigkill_timeout").exit_code != 0)
    GTEST_SKIP() << "this Open MPI has no odls_base_sigkill_timeout (Open MPI 5 has none)";
  TemporaryDirectory dir;
  const std::string log = (dir / "log.txt").string();
  testing::BackgroundProcess run(
      mpirun(2) + " --mca odls_base_sigkill_timeout 3 " +
          testing::mltrain(write_config(dir, 1000000) + " --set train.log_every=50"),
      log);
  testing::wait_for_step(dir / "run" / "metrics.jsonl", 50);
  run.signal(SIGINT);
  EXPECT_NE(run.wait(), -1) << testing::read_text(log);
  EXPECT_CONTAINS(testing::read_text(log), "stopped by Terminated");
  EXPECT_GE(testing::latest_step(dir / "run"), 50);
}

// Under a plain mpirun, SIGUSR1 to mpirun is the way to stop with a checkpoint, and the run says so
// when it starts.
TEST(RankFaults, SigusrOneToMpirunCheckpointsAndExitsZero) {
  TemporaryDirectory dir;
  const std::string log = (dir / "log.txt").string();
  testing::BackgroundProcess run(mpirun(2) + " " + testing::mltrain(write_config(dir, 1000000)),
                                 log);
  testing::wait_for_step(dir / "run" / "metrics.jsonl", 3);
  run.signal(SIGUSR1);
  ASSERT_EQ(run.wait(), 0) << testing::read_text(log);
  EXPECT_CONTAINS(testing::read_text(log), "to stop with a checkpoint, send SIGUSR1 to mpirun");
  EXPECT_GE(testing::latest_step(dir / "run"), 3);
}

}  // namespace
}  // namespace mltrain
