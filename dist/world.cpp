#include "dist/world.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace mltrain {

World init_world(int* argc, char*** argv) {
  const LaunchEnvironment launch = read_launch_environment(process_environment);
  World world{.rank = launch.rank,
              .size = launch.size,
              .local_rank = launch.local_rank,
              .local_size = launch.local_size,
              .uses_mpi = launch.launcher == Launcher::mpi,
              .launcher = launch.launcher,
              .rendezvous_host = launch.rendezvous_host,
              .rendezvous_port = launch.rendezvous_port};
  if (!world.uses_mpi) return world;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw std::runtime_error(
        "the MPI library does not support MPI_THREAD_MULTIPLE, which the "
        "overlapped gradient all-reduce needs");
  }
  // Errors come back as codes that mltrain turns into messages, rather than aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &world.local_rank);
  MPI_Comm_size(node, &world.local_size);
  MPI_Comm_free(&node);
  return world;
}

void finalize_world(const World& world) {
  if (world.uses_mpi) MPI_Finalize();
}

void abort_world(const World& world, int code) {
  if (world.uses_mpi) {
    // The launcher forwards each rank's output asynchronously and stops doing so once it kills
    // the ranks: give it a moment to pass on the error this rank has just printed.
    std::fflush(stdout);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::exit(code);
}

}  // namespace mltrain
