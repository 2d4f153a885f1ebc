#pragma once

#include <functional>
#include <optional>
#include <string>

namespace mltrain {

// What started this process, told by the variables each launcher sets in every process it starts.
enum class Launcher {
  none,      // a plain `mltrain`: a world of one
  mpi,       // mpirun, or srun --mpi: the world comes from MPI
  slurm,     // srun without MPI: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST
  torchrun,  // torchrun or a script like launch/ranks.sh: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*
};

// This process's place in the world as its launcher's variables give it, and for the launchers
// without MPI where the ranks meet (the rendezvous: rank 0 serves a store there).
struct LaunchEnvironment {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string rendezvous_host;
  int rendezvous_port = 0;
};

// A variable of the environment, if set.
using EnvironmentReader = std::function<std::optional<std::string>(const std::string& name)>;
std::optional<std::string> process_environment(const std::string& name);

// Which launcher started this process, and, for Slurm without MPI and torchrun, the place it gives.
// MPI's variables come first (srun --mpi sets Slurm's too), then torchrun's (RANK, WORLD_SIZE or
// LOCAL_RANK set), then Slurm's (SLURM_PROCID set). A launcher's variable missing or out of range
// is a UserError that names it. Under Slurm the rendezvous is the first node of SLURM_NODELIST (or
// MASTER_ADDR) at MASTER_PORT, else a port of the job's (29500 + SLURM_JOB_ID % 1000); the number
// of ranks is the job step's (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS).
LaunchEnvironment read_launch_environment(const EnvironmentReader& environment);

// "mpirun", "srun (Slurm, without MPI)", ...: for the run's header.
std::string launcher_name(Launcher launcher);

// The first host of a Slurm host list: "gpu[03-05,9],cpu1" is gpu03.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace mltrain
