#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace mltrain {

// MPI calls that poll rather than block, shared by the MPI and NCCL communicators: a peer that
// hangs (rather than dies, which the launcher handles) ends the run after dist.timeout_s with a
// message that names the operation, instead of blocking every other rank for ever.

// Throws naming `operation` unless `code` is MPI_SUCCESS.
void check_mpi(int code, const std::string& operation);

// Waits for a non-blocking MPI operation; throws after timeout_s.
void wait_for(MPI_Request& request, double timeout_s, const std::string& operation);

// Starts the sum over the ranks of `comm` of a host value; its wait() polls with the same
// deadline.
std::unique_ptr<PendingSum> start_host_sum(double value, MPI_Comm comm, double timeout_s);

}  // namespace mltrain
