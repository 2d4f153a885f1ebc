#pragma once

#include <string>

#include "dist/launch_environment.h"

namespace mltrain {

// The most ranks a run, a dry run's plan or a checkpoint's state may name: a number past it is a
// slip, not a cluster.
inline constexpr int kMostRanks = 1 << 20;

// This process's place among the ranks of a run. A run started by a launcher (mpirun, srun,
// torchrun) has one rank per process; a plain `mltrain` is a world of one and needs no MPI at all.
struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this node: the GPU this rank drives
  int local_size = 1;
  bool uses_mpi = false;
  Launcher launcher = Launcher::none;
  // Where ranks started without MPI meet: rank 0 serves a store at this host and port
  // (rendezvous_store.h).
  std::string rendezvous_host;
  int rendezvous_port = 0;
};

// Finds the rank's place from its launcher's variables (launch_environment.h; a missing one is a
// UserError), and initialises MPI (with thread support: gradient hooks communicate from autograd's
// threads) when an MPI launcher started this process.
World init_world(int* argc, char*** argv);

// Finalises MPI if init_world started it.
void finalize_world(const World& world);

// Makes every rank exit with `code` (MPI_Abort), so that a rank that fails does not leave the
// others waiting in a collective.
[[noreturn]] void abort_world(const World& world, int code);

}  // namespace mltrain
