// Ranks started without MPI, as torchrun and srun start them: torchrun itself, launch/ranks.sh
// (torchrun's variables) and a plain shell script with Slurm's, each 2 CPU ranks over Gloo, against
// 1 rank with the same global batch; the rendezvous over TCP and over a shared file; and what a
// missing variable or a missing rank does.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "common/error.h"
#include "model/interop/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::read_text;
using testing::run_command;
using testing::TemporaryDirectory;

constexpr int64_t kGlobalBatch = 12;  // windows per step, in 2 micro-steps

// The tiny run's config file, and the options that give each of `ranks` ranks its share of the
// global batch in `run_dir`.
std::string config_file(const TemporaryDirectory& dir) {
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 10;
  config.train.log_every = 1;
  config.train.eval_every = 1000000;
  config.data.grad_accum = 2;
  config.dist.bucket_mb = 0.005;  // several buckets, parts of which begin inside tensors
  const auto path = dir / "run.yaml";
  testing::write_text(path, config_to_yaml(config));
  return path.string();
}

std::string arguments(const TemporaryDirectory& dir, int ranks, const std::string& run,
                      int64_t global_batch = kGlobalBatch) {
  return fmt::format("{} --set train.run_dir={} --set data.micro_batch={} --set train.threads=1",
                     config_file(dir), (dir / run).string(), global_batch / 2 / ranks);
}

constexpr const char* kMltrain = MLTRAIN_BIN_DIR "/mltrain";

void expect_like_one_rank(const TemporaryDirectory& dir, const std::string& run,
                          int64_t global_batch = kGlobalBatch) {
  const auto one =
      run_command(fmt::format("{} {}", kMltrain, arguments(dir, 1, "one", global_batch)));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const NamedTensors expected = load_safetensors(dir / "one/checkpoints/step_00000010" / file);
    const NamedTensors actual = load_safetensors(dir / run / "checkpoints/step_00000010" / file);
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, tensor] : expected)
      EXPECT_LE(testing::relative_error(actual.at(name), tensor), 1e-5) << file << ": " << name;
  }
}

TEST(Launchers, TwoRanksOfRanksShTrainLikeOneRank) {
  TemporaryDirectory dir;
  const auto two = run_command(
      fmt::format("MLTRAIN_BIN={} MASTER_PORT={} timeout 300 bash {}/launch/ranks.sh 2 {}",
                  kMltrain, testing::free_port(), MLTRAIN_SOURCE_DIR, arguments(dir, 2, "two")));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_CONTAINS(two.output, "launcher: torchrun's variables");
  EXPECT_CONTAINS(two.output, "2 ranks agree on the config");
  expect_like_one_rank(dir, "two");
}

// Hybrid sharding over Gloo: 4 ranks as 2 groups of 2 (dist.shard_ranks), each group a Gloo
// group of its own, at stage 3. 24 windows a step: 3 for each rank.
TEST(Launchers, FourGlooRanksAsTwoShardGroupsTrainLikeOneRank) {
  TemporaryDirectory dir;
  const auto four = run_command(fmt::format(
      "MLTRAIN_BIN={} MASTER_PORT={} timeout 300 bash {}/launch/ranks.sh 4 {} "
      "--set dist.zero_stage=3 --set dist.shard_ranks=2",
      kMltrain, testing::free_port(), MLTRAIN_SOURCE_DIR, arguments(dir, 4, "four", 24)));
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_CONTAINS(four.output, "dist.shard_ranks 2: 2 groups of 2 ranks");
  expect_like_one_rank(dir, "four", 24);
}

// torchrun itself (the wheel's, in the tests' Python environment), whose agent serves the store.
TEST(Launchers, TwoRanksOfTorchrunTrainLikeOneRank) {
  TemporaryDirectory dir;
  const std::string torchrun =
      (std::filesystem::path(MLTRAIN_PYTHON).parent_path() / "torchrun").string();
  const auto two = run_command(
      fmt::format("timeout 300 {} --nproc-per-node=2 --master-port={} --no-python {} {}", torchrun,
                  testing::free_port(), kMltrain, arguments(dir, 2, "torchrun")));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_CONTAINS(two.output, "2 ranks agree on the config");
  expect_like_one_rank(dir, "torchrun");
}

// Two ranks with Slurm's variables, started by a plain shell script as srun without MPI starts
// them, sharded (ZeRO-1: reduce-scatter and all-gather over Gloo) and meeting at a file.
TEST(Launchers, TwoRanksWithSlurmsVariablesTrainLikeOneRank) {
  TemporaryDirectory dir;
  const std::string rank = fmt::format(
      "SLURM_NTASKS=2 SLURM_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=2 timeout 300 {} {} "
      "--set dist.zero_stage=1 --set dist.rendezvous=file:{}",
      kMltrain, arguments(dir, 2, "slurm"), (dir / "rendezvous").string());
  const auto two =
      run_command(fmt::format("SLURM_PROCID=0 SLURM_LOCALID=0 {0} > {1}/rank0.txt 2>&1 & "
                              "SLURM_PROCID=1 SLURM_LOCALID=1 {0} > {1}/rank1.txt 2>&1; "
                              "one=$?; wait $!; zero=$?; echo exits $zero $one",
                              rank, dir.path().string()));
  EXPECT_CONTAINS(two.output, "exits 0 0");
  const std::string log = read_text(dir / "rank0.txt");
  EXPECT_CONTAINS(log, "launcher: srun, without MPI");
  EXPECT_CONTAINS(log, "the ranks met at file:");
  EXPECT_CONTAINS(log, "2 ranks agree on the config");
  expect_like_one_rank(dir, "slurm");
}

// Over Gloo, a rank stopped whole (SIGSTOP) is named by the rank that gives up waiting for it,
// from the flight records (rank_fault_test.cpp has the same under mpirun). Nothing ends the
// stopped rank but the script.
TEST(Launchers, AStoppedRankIsNamedByTheRankWaitingForIt) {
  TemporaryDirectory dir;
  const std::string rank = fmt::format(
      "MLTRAIN_FAULT=stop-rank:1 SLURM_NTASKS=2 SLURM_NODELIST=localhost MASTER_PORT={} "
      "timeout 120 {}/mltrain_faults {} --set train.max_steps=1000000 --set dist.timeout_s=4",
      testing::free_port(), MLTRAIN_BIN_DIR, arguments(dir, 2, "run"));
  const auto run = run_command(
      fmt::format("SLURM_PROCID=1 SLURM_LOCALID=1 {0} > {1}/rank1.txt 2>&1 & stopped=$!; "
                  "SLURM_PROCID=0 SLURM_LOCALID=0 {0} > {1}/rank0.txt 2>&1; zero=$?; "
                  "kill -KILL $stopped; echo exit $zero",
                  rank, dir.path().string()));
  const std::string log = read_text(dir / "rank0.txt");
  EXPECT_CONTAINS(run.output, "exit 1");
  EXPECT_CONTAINS(read_text(dir / "rank1.txt"), "rank 1 stops");
  EXPECT_CONTAINS(log, "did not finish within dist.timeout_s = 4 s");
  EXPECT_CONTAINS(log,
                  "rank 1 had not reached it: it wrote no flight record (stopped, gone, or not "
                  "sharing the run directory)");
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "flight" / "rank_0.json"));
}

TEST(Launchers, AMissingVariableIsExitTwoBeforeAnythingIsWritten) {
  TemporaryDirectory dir;
  const auto missing =
      run_command(fmt::format("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 {} {}",
                              kMltrain, arguments(dir, 2, "run")));
  EXPECT_EQ(missing.exit_code, kExitUserError) << missing.output;
  EXPECT_CONTAINS(missing.output, "MASTER_PORT is not set: torchrun (or launch/ranks.sh) sets it");
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

TEST(Launchers, ARendezvousThatIsNeitherTcpNorAFileIsExitTwo) {
  TemporaryDirectory dir;
  for (const char* rendezvous : {"udp", "file:", "FILE:/tmp/x", "tcp:host"}) {
    const auto refused = run_command(fmt::format("{} {} --dry-run --set 'dist.rendezvous=\"{}\"'",
                                                 kMltrain, arguments(dir, 1, "run"), rendezvous));
    EXPECT_EQ(refused.exit_code, kExitUserError) << rendezvous << "\n" << refused.output;
    EXPECT_CONTAINS(refused.output, "dist.rendezvous must be tcp or file:PATH");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

// A file store in a directory that is not there, or that no rank may write, or in place of
// something that is no file: exit 2 naming it, before the run directory is made.
TEST(Launchers, AFileRendezvousWhereNoFileCanBeMadeIsExitTwo) {
  TemporaryDirectory dir;
  testing::write_text(dir / "a_file", "");
  const auto no_directory = [](const std::filesystem::path& place) {
    return fmt::format("cannot make the store's file in {}", place.parent_path().string());
  };
  const auto no_file = [](const std::filesystem::path& place) {
    return fmt::format("{} is not a file", place.string());
  };
  const std::vector<std::pair<std::filesystem::path, std::string>> cases = {
      {dir / "missing" / "store", no_directory(dir / "missing" / "store")},
      {dir / "a_file" / "store", no_directory(dir / "a_file" / "store")},
      {"/proc/self/store", no_directory("/proc/self/store")},
      {dir.path(), no_file(dir.path())},
      {"/dev/null", no_file("/dev/null")},
  };
  for (const auto& [place, message] : cases) {
    const auto refused = run_command(fmt::format(
        "SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NODELIST=localhost timeout 60 {} {} "
        "--set dist.rendezvous=file:{}",
        kMltrain, arguments(dir, 2, "run"), place.string()));
    EXPECT_EQ(refused.exit_code, kExitUserError) << place << "\n" << refused.output;
    EXPECT_CONTAINS(refused.output,
                    fmt::format("dist.rendezvous file:{}: {}", place.string(), message));
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

TEST(Launchers, ARankThatNeverComesEndsTheRendezvousWithinTheTimeout) {
  TemporaryDirectory dir;
  const int port = testing::free_port();
  const auto alone = run_command(fmt::format(
      "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT={} timeout 120 {} {} "
      "--set dist.timeout_s=2",
      port, kMltrain, arguments(dir, 2, "run")));
  EXPECT_EQ(alone.exit_code, kExitRuntimeFailure) << alone.output;
  EXPECT_CONTAINS(alone.output, fmt::format("rank 0 of 2: the rendezvous at 127.0.0.1:{} (TCP, "
                                            "served by rank 0) failed within dist.timeout_s = 2 s",
                                            port));
}

}  // namespace
}  // namespace mltrain
