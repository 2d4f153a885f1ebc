#pragma once

#include <memory>

#include "dist/communicator.h"

namespace mltrain {

// NCCL collectives on CUDA tensors, one GPU per rank (cuda:local_rank), as PyTorch's
// ProcessGroupNCCL runs them. Rank 0 makes the NCCL unique id and `host`, the ranks' CPU
// communicator (MPI, or Gloo for ranks started without MPI), broadcasts it. All-reduces
// run on a dedicated stream, ordered after the compute stream with an event; waiting for one
// only makes the compute stream wait for another event, so the host never stalls on the device.
// A watchdog thread watches every operation in flight and the communicator's asynchronous error:
// after dist.timeout_s, or on an error, it aborts the communicator, logs the operation that
// failed and ends the process with exit code 1 (every healthy rank's watchdog does the same).
// Host-side waits (the unique id, set-up, host values) poll with the same deadline. A clean exit
// finalizes the communicator; abort is for errors only. Host values (flags, counts) go over `host`.
// Its collectives are recorded in `flight`, which `host` records into too; the watchdog records
// their completion, and names a failure's collective through it.
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, double timeout_s,
                                                     std::unique_ptr<Communicator> host,
                                                     std::shared_ptr<FlightRecorder> flight);

}  // namespace mltrain
