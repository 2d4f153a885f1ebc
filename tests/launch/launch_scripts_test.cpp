// The launch scripts' own arguments (launch/ranks.sh, launch/local_ranks.sh,
// launch/slurm/train.sbatch): a missing one or a count that is no positive whole number is said
// with the usage, exit 2, and nothing is started. mltrain, mpirun and srun are stand-ins here that
// leave a mark when started.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::TemporaryDirectory;

class LaunchScripts : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(directory_ / "bin");
    for (const char* program : {"mltrain", "mpirun", "srun"}) {
      const auto path = directory_ / "bin" / program;
      testing::write_text(path, fmt::format("#!/bin/sh\necho {0} >> {1}\n", program,
                                            (directory_ / "started").string()));
      std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    }
    testing::write_text(directory_ / "run.yaml", "{}\n");
  }

  // `script` (relative to launch/) run with `arguments` and `environment` before it, from the
  // test's directory, with the stand-ins first in PATH. Killed if it outlives a minute: ranks.sh
  // takes SIGTERM as the request to checkpoint, and goes on.
  CommandResult run(const std::string& script, const std::string& arguments,
                    const std::string& environment = "") const {
    return testing::run_command(fmt::format(
        "cd {0} && {1} MLTRAIN_BIN={0}/bin/mltrain PATH={0}/bin:$PATH "
        "timeout -k 5 60 bash {2}/launch/{3} {4}",
        directory_.path().string(), environment, MLTRAIN_SOURCE_DIR, script, arguments));
  }

  bool started() const { return std::filesystem::exists(directory_ / "started"); }

  TemporaryDirectory directory_;
};

TEST_F(LaunchScripts, ABadRankCountOrAMissingArgumentIsTheUsageAndExitTwo) {
  for (const char* script : {"ranks.sh", "local_ranks.sh"}) {
    const std::string usage = fmt::format("usage: launch/{} RANKS CONFIG.yaml", script);
    const auto bad_count = [](const std::string& count) {
      return fmt::format("RANKS must be a whole number from 1 to 1024, got \"{}\"", count);
    };
    for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
             {"", "RANKS and CONFIG.yaml are missing"},
             {"2", "CONFIG.yaml is missing"},
             {"0 run.yaml", bad_count("0")},
             {"-1 run.yaml", bad_count("-1")},
             {"abc run.yaml", bad_count("abc")},
             {"1.5 run.yaml", bad_count("1.5")},
             {"'' run.yaml", bad_count("")},
             {"' 2' run.yaml", bad_count(" 2")},
             {"1025 run.yaml", bad_count("1025")},
             {"99999999999999999999 run.yaml", bad_count("99999999999999999999")},
             {"run.yaml", bad_count("run.yaml")}}) {
      SCOPED_TRACE(std::string(script) + " " + arguments);
      const CommandResult refused = run(script, arguments);
      EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
      EXPECT_CONTAINS(refused.output, fmt::format("{}: {}\n{}", script, message, usage));
      EXPECT_FALSE(started()) << refused.output;
    }
    const CommandResult help = run(script, "--help");
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_CONTAINS(help.output, usage);
  }
  // A count with leading zeros is still base 10, and a good one starts the ranks.
  const CommandResult two = run("local_ranks.sh", "08 run.yaml");
  EXPECT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(started());
}

// ranks.sh's variables for several nodes are checked as its count is.
TEST_F(LaunchScripts, RanksShRefusesBadNodeVariables) {
  for (const auto& [environment, message] : std::vector<std::pair<std::string, std::string>>{
           {"NNODES=0", "NNODES must be a whole number from 1 to 524288, got \"0\""},
           {"NNODES=two", "NNODES must be a whole number from 1 to 524288, got \"two\""},
           {"NNODES=2 NODE_RANK=2", "NODE_RANK must be a whole number from 0 to 1, got \"2\""},
           {"NODE_RANK=-1", "NODE_RANK must be a whole number from 0 to 0, got \"-1\""},
           {"MASTER_PORT=70000", "MASTER_PORT must be a whole number from 1 to 65535"},
           {"MASTER_PORT=http", "MASTER_PORT must be a whole number from 1 to 65535"}}) {
    SCOPED_TRACE(environment);
    const CommandResult refused = run("ranks.sh", "2 run.yaml", environment);
    EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
    EXPECT_CONTAINS(refused.output, "ranks.sh: " + message);
    EXPECT_FALSE(started()) << refused.output;
  }
  const CommandResult two = run("ranks.sh", "2 run.yaml", "NNODES=2 NODE_RANK=1");
  EXPECT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(testing::read_text(directory_ / "started"), "mltrain\nmltrain\n");
}

TEST_F(LaunchScripts, TrainSbatchNeedsItsConfigFirst) {
  const std::string usage = "usage: sbatch launch/slurm/train.sbatch CONFIG.yaml";
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "CONFIG.yaml is missing"},
           {"--set train.max_steps=5",
            "CONFIG.yaml comes first, before the mltrain options, got \"--set\""},
           {"missing.yaml", "CONFIG.yaml \"missing.yaml\" is not a file"},
           {"bin", "CONFIG.yaml \"bin\" is not a file"}}) {
    SCOPED_TRACE(arguments);
    const CommandResult refused = run("slurm/train.sbatch", arguments);
    EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
    EXPECT_CONTAINS(refused.output, "train.sbatch: " + message);
    EXPECT_CONTAINS(refused.output, usage);
    EXPECT_FALSE(started()) << refused.output;
  }
  const CommandResult started_job = run("slurm/train.sbatch", "run.yaml");
  EXPECT_EQ(started_job.exit_code, 0) << started_job.output;
  EXPECT_TRUE(started());
}

}  // namespace
}  // namespace mltrain
