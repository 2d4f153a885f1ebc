// Which launcher started a rank, and the place it gives, read from its variables.
#include "dist/launch_environment.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using Variables = std::map<std::string, std::string>;

LaunchEnvironment read(const Variables& variables) {
  return read_launch_environment([&](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  });
}

// The message of the UserError that reading `variables` throws.
std::string refusal(const Variables& variables) {
  try {
    read(variables);
  } catch (const UserError& error) {
    return error.what();
  }
  return "no error";
}

const Variables kTorchrun = {{"RANK", "5"},         {"WORLD_SIZE", "8"},
                             {"LOCAL_RANK", "1"},   {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29400"}};

TEST(LaunchEnvironment, NoLauncherIsAWorldOfOne) {
  const LaunchEnvironment launch = read({{"HOME", "/root"}});
  EXPECT_EQ(launch.launcher, Launcher::none);
  EXPECT_EQ(launch.size, 1);
  EXPECT_EQ(launch.rank, 0);
}

TEST(LaunchEnvironment, TorchrunsVariablesGiveThePlaceAndTheRendezvous) {
  const LaunchEnvironment launch = read(kTorchrun);
  EXPECT_EQ(launch.launcher, Launcher::torchrun);
  EXPECT_EQ(launch.rank, 5);
  EXPECT_EQ(launch.size, 8);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.local_size, 4);
  EXPECT_EQ(launch.rendezvous_host, "n1");
  EXPECT_EQ(launch.rendezvous_port, 29400);
}

TEST(LaunchEnvironment, MpiComesFirst) {
  Variables variables = kTorchrun;
  variables["OMPI_COMM_WORLD_SIZE"] = "2";
  variables["SLURM_PROCID"] = "0";
  EXPECT_EQ(read(variables).launcher, Launcher::mpi);
}

TEST(LaunchEnvironment, EachMissingOrBadVariableIsNamed) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Variables variables = kTorchrun;
    variables.erase(name);
    EXPECT_CONTAINS(refusal(variables), std::string(name) + " is not set");
  }
  Variables bad = kTorchrun;
  bad["MASTER_PORT"] = "70000";
  EXPECT_CONTAINS(refusal(bad), "MASTER_PORT=70000: must be an integer from 1 to 65535");
  bad = kTorchrun;
  bad["RANK"] = "8";
  EXPECT_CONTAINS(refusal(bad), "RANK=8 is not below WORLD_SIZE=8");
  bad = kTorchrun;
  bad["WORLD_SIZE"] = "two";
  EXPECT_CONTAINS(refusal(bad), "WORLD_SIZE=two: must be an integer");
}

TEST(LaunchEnvironment, SrunWithoutMpiMeetsAtTheFirstNodeOnAPortOfTheJob) {
  const Variables srun = {{"SLURM_PROCID", "3"},
                          {"SLURM_NTASKS", "16"},
                          {"SLURM_STEP_NUM_TASKS", "4"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                          {"SLURM_NODELIST", "gpu[07-08]"},
                          {"SLURM_JOB_ID", "123456"}};
  const LaunchEnvironment launch = read(srun);
  EXPECT_EQ(launch.launcher, Launcher::slurm);
  EXPECT_EQ(launch.rank, 3);
  EXPECT_EQ(launch.size, 4);  // the step's tasks, not the job's
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.local_size, 2);
  EXPECT_EQ(launch.rendezvous_host, "gpu07");
  EXPECT_EQ(launch.rendezvous_port, 29500 + 456);

  Variables chosen = srun;
  chosen["MASTER_ADDR"] = "login1";
  chosen["MASTER_PORT"] = "31000";
  EXPECT_EQ(read(chosen).rendezvous_host, "login1");
  EXPECT_EQ(read(chosen).rendezvous_port, 31000);

  Variables missing = srun;
  missing.erase("SLURM_NODELIST");
  EXPECT_CONTAINS(refusal(missing), "SLURM_NODELIST is not set: srun sets it");
}

// A MASTER_ADDR set but blank is a slip under either launcher's variables: refused at once, not
// looked up for the rendezvous timeout; so is a host list whose first host is blank.
TEST(LaunchEnvironment, ABlankMeetingHostIsRefused) {
  const Variables srun = {{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "2"},
                          {"SLURM_LOCALID", "0"},
                          {"SLURM_NODELIST", "gpu[07-08]"}};
  for (const char* blank : {"", " ", "n1 n2", "\t"}) {
    Variables slurm = srun;
    slurm["MASTER_ADDR"] = blank;
    EXPECT_CONTAINS(refusal(slurm),
                    "MASTER_ADDR=\"" + std::string(blank) + "\": not a host name or address");
    Variables torchrun = kTorchrun;
    torchrun["MASTER_ADDR"] = blank;
    EXPECT_CONTAINS(refusal(torchrun), "MASTER_ADDR");
    EXPECT_NE(refusal(torchrun), "no error");
  }
  Variables torchrun = kTorchrun;
  torchrun["MASTER_ADDR"] = "";
  EXPECT_CONTAINS(refusal(torchrun), "MASTER_ADDR is set but empty");
  Variables list = srun;
  list["SLURM_NODELIST"] = ",gpu01";
  EXPECT_CONTAINS(refusal(list), "SLURM_NODELIST=\",gpu01\": not a Slurm host list");
}

TEST(LaunchEnvironment, TheFirstHostOfASlurmHostList) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[03-05,9],cpu1"), "gpu03");
  EXPECT_EQ(first_slurm_host("cpu1,gpu[03-05]"), "cpu1");
  EXPECT_EQ(first_slurm_host("a-b[12,14]-ib"), "a-b12-ib");
  EXPECT_THROW(first_slurm_host("gpu[03-05"), UserError);
}

}  // namespace
}  // namespace mltrain
