#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "dist/communicator.h"

namespace mltrain {

// Collectives on CPU tensors through c10d's ProcessGroupGloo, for ranks started without MPI
// (torchrun, srun without MPI), set up over `store` (rendezvous_store.h). Every operation is
// bounded by timeout_s: a rank that is behind, stopped or gone makes the others' waits throw,
// naming the collective. The same role as the MPI communicator: CPU training of several ranks,
// and the host values of an NCCL run. Its collectives are recorded in `flight`.
std::unique_ptr<Communicator> make_gloo_communicator(const World& world,
                                                     c10::intrusive_ptr<c10d::Store> store,
                                                     double timeout_s,
                                                     std::shared_ptr<FlightRecorder> flight);

}  // namespace mltrain
