#include "dist/launch_environment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "common/error.h"
#include "dist/world.h"

namespace mltrain {
namespace {

constexpr int kDefaultPort = 29500;  // torchrun's
constexpr int kMostPort = 65535;

// Whether `text` can name a host: not empty, no spaces, no control characters.
bool is_host(const std::string& text) {
  return !text.empty() && std::none_of(text.begin(), text.end(), [](unsigned char c) {
    return std::isspace(c) != 0 || std::iscntrl(c) != 0;
  });
}

// Reads the launcher's variables, each failure a UserError that names the variable and who sets
// it.
class LauncherVariables {
 public:
  LauncherVariables(const EnvironmentReader& environment, std::string launcher)
      : environment_(environment), launcher_(std::move(launcher)) {}

  std::string text(const std::string& name) const {
    const auto value = environment_(name);
    if (!value || value->empty())
      throw UserError(
          fmt::format("{} is {}: {} sets it for every rank, and a run started "
                      "without it cannot tell which rank it is or where the ranks meet",
                      name, value ? "set but empty" : "not set", launcher_));
    return *value;
  }

  int integer(const std::string& name, int min, int max) const {
    const std::string value = text(name);
    int number = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
    if (error != std::errc() || end != value.data() + value.size() || number < min || number > max)
      throw UserError(fmt::format("{}={}: must be an integer from {} to {} ({} sets it)", name,
                                  value, min, max, launcher_));
    return number;
  }

  // A host name or address: a blank one would be looked up for the whole rendezvous timeout
  // before the run said anything.
  std::string host(const std::string& name) const {
    const std::string value = text(name);
    if (!is_host(value))
      throw UserError(fmt::format("{}=\"{}\": not a host name or address ({} sets it)", name, value,
                                  launcher_));
    return value;
  }

  std::optional<std::string> optional(const std::string& name) const { return environment_(name); }

 private:
  const EnvironmentReader& environment_;
  std::string launcher_;
};

bool any_set(const EnvironmentReader& environment, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (environment(name)) return true;
  return false;
}

void check_ranks(const LaunchEnvironment& launch, const std::string& rank_variable,
                 const std::string& size_variable) {
  if (launch.rank >= launch.size)
    throw UserError(fmt::format("{}={} is not below {}={}", rank_variable, launch.rank,
                                size_variable, launch.size));
  if (launch.local_rank >= launch.local_size)
    throw UserError(fmt::format("the local rank {} is not below the ranks on this node ({})",
                                launch.local_rank, launch.local_size));
}

LaunchEnvironment torchrun(const EnvironmentReader& environment) {
  const LauncherVariables variables(environment, "torchrun (or launch/ranks.sh)");
  LaunchEnvironment launch;
  launch.launcher = Launcher::torchrun;
  launch.size = variables.integer("WORLD_SIZE", 1, kMostRanks);
  launch.rank = variables.integer("RANK", 0, kMostRanks);
  launch.local_rank = variables.integer("LOCAL_RANK", 0, kMostRanks);
  launch.local_size = variables.optional("LOCAL_WORLD_SIZE")
                          ? variables.integer("LOCAL_WORLD_SIZE", 1, kMostRanks)
                          : launch.local_rank + 1;
  launch.rendezvous_host = variables.host("MASTER_ADDR");
  launch.rendezvous_port = variables.integer("MASTER_PORT", 1, kMostPort);
  check_ranks(launch, "RANK", "WORLD_SIZE");
  return launch;
}

// The leading count of a Slurm tasks-per-node list, "4(x2),3": 4.
int first_count(const std::string& list) {
  int count = 0;
  std::from_chars(list.data(), list.data() + list.size(), count);
  return count;
}

LaunchEnvironment slurm(const EnvironmentReader& environment) {
  const LauncherVariables variables(environment, "srun");
  LaunchEnvironment launch;
  launch.launcher = Launcher::slurm;
  launch.size = variables.optional("SLURM_STEP_NUM_TASKS")
                    ? variables.integer("SLURM_STEP_NUM_TASKS", 1, kMostRanks)
                    : variables.integer("SLURM_NTASKS", 1, kMostRanks);
  launch.rank = variables.integer("SLURM_PROCID", 0, kMostRanks);
  launch.local_rank = variables.integer("SLURM_LOCALID", 0, kMostRanks);
  const auto per_node = variables.optional("SLURM_STEP_TASKS_PER_NODE");
  launch.local_size = std::max(per_node ? first_count(*per_node) : 1, launch.local_rank + 1);
  // MASTER_ADDR, where set, is checked as torchrun's is: set empty, it is a slip (a script's
  // variable that was never filled in), not a wish for the first node.
  if (const auto master = variables.optional("MASTER_ADDR")) {
    if (!is_host(*master))
      throw UserError(fmt::format(
          "MASTER_ADDR=\"{}\": not a host name or address; give rank 0's host, or unset it for "
          "the ranks to meet at the first node of SLURM_NODELIST",
          *master));
    launch.rendezvous_host = *master;
  } else {
    const std::string nodelist = variables.text("SLURM_NODELIST");
    launch.rendezvous_host = first_slurm_host(nodelist);
    if (!is_host(launch.rendezvous_host))
      throw UserError(
          fmt::format("SLURM_NODELIST=\"{}\": not a Slurm host list (srun sets it)", nodelist));
  }
  if (variables.optional("MASTER_PORT")) {
    launch.rendezvous_port = variables.integer("MASTER_PORT", 1, kMostPort);
  } else {
    const auto job = variables.optional("SLURM_JOB_ID");
    launch.rendezvous_port = kDefaultPort + (job ? first_count(*job) % 1000 : 0);
  }
  check_ranks(launch, "SLURM_PROCID", "SLURM_NTASKS");
  return launch;
}

}  // namespace

std::optional<std::string> process_environment(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

LaunchEnvironment read_launch_environment(const EnvironmentReader& environment) {
  // Open MPI, MPICH/Hydra and PMIx launchers each set one of these in every process they start.
  if (any_set(environment, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})) {
    LaunchEnvironment launch;  // MPI tells the rest
    launch.launcher = Launcher::mpi;
    return launch;
  }
  if (any_set(environment, {"RANK", "WORLD_SIZE", "LOCAL_RANK"})) return torchrun(environment);
  if (any_set(environment, {"SLURM_PROCID"})) return slurm(environment);
  return {};
}

std::string launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none:
      return "no launcher";
    case Launcher::mpi:
      return "MPI (mpirun or srun --mpi)";
    case Launcher::slurm:
      return "srun, without MPI (SLURM_PROCID, SLURM_NTASKS)";
    case Launcher::torchrun:
      return "torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR)";
  }
  return "";
}

std::string first_slurm_host(const std::string& nodelist) {
  const size_t comma = nodelist.find(',');
  const size_t bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  // prefix[03-05,9]suffix: the prefix, the first number of the range (its zeros kept), the suffix.
  const size_t close = nodelist.find(']', bracket);
  const size_t end = nodelist.find_first_of("-,]", bracket + 1);
  if (close == std::string::npos || end == bracket + 1)
    throw UserError(fmt::format("SLURM_NODELIST={}: not a Slurm host list", nodelist));
  const size_t suffix_end = nodelist.find(',', close);
  return nodelist.substr(0, bracket) + nodelist.substr(bracket + 1, end - bracket - 1) +
         nodelist.substr(close + 1, suffix_end == std::string::npos ? std::string::npos
                                                                    : suffix_end - close - 1);
}

}  // namespace mltrain
