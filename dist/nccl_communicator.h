#pragma once

#include <memory>

#include "dist/communicator.h"

namespace mltrain {

// NCCL collectives on CUDA tensors, one GPU per rank (cuda:local_rank). Rank 0 makes the NCCL
// unique id and MPI broadcasts it. The communicator is non-blocking: all-reduces run on a
// dedicated stream, ordered after the compute stream with an event, and the compute stream
// waits for them with another; waits poll for completion and for asynchronous NCCL errors, and
// after timeout_s the communicator is aborted and the wait throws, so that a dead or stuck peer
// ends the run instead of hanging it. Host values (losses, flags) go over MPI.
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, double timeout_s);

}  // namespace mltrain
