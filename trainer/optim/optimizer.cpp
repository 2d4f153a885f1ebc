#include "trainer/optim/optimizer.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "trainer/optim/muon_optimizer.h"
#include "trainer/optim/replicated_adamw.h"
#include "trainer/optim/zero1_adamw.h"
#include "trainer/optim/zero3_adamw.h"

namespace mltrain {

// Sharding copies on the device, which can fail (a CUDA error after a collective failed): said,
// rather than thrown out of a destructor, which would end the process without a word.
WholeWeights::~WholeWeights() {
  try {
    optimizer_.shard_weights();
  } catch (const std::exception& error) {
    spdlog::error("the weights could not be sharded again: {}", error.what());
  }
}

std::unique_ptr<Optimizer> make_optimizer(const NamedParameters& parameters,
                                          Communicator& communicator,
                                          const DataParallelOptions& options,
                                          const UnitParameters& units) {
  if (options.shard_weights)
    return std::make_unique<Zero3AdamW>(parameters, units, communicator, options);
  if (options.muon) return std::make_unique<MuonOptimizer>(parameters, communicator, options);
  if (options.zero1) return std::make_unique<Zero1AdamW>(parameters, communicator, options);
  return std::make_unique<ReplicatedAdamW>(parameters, communicator, options);
}

}  // namespace mltrain
