#include "trainer/optim/optimizer.h"

#include "trainer/optim/muon_optimizer.h"
#include "trainer/optim/replicated_adamw.h"
#include "trainer/optim/zero1_adamw.h"

namespace mltrain {

std::unique_ptr<Optimizer> make_optimizer(const NamedParameters& parameters,
                                          Communicator& communicator,
                                          const DataParallelOptions& options) {
  if (options.muon) return std::make_unique<MuonOptimizer>(parameters, communicator, options);
  if (options.zero1) return std::make_unique<Zero1AdamW>(parameters, communicator, options);
  return std::make_unique<ReplicatedAdamW>(parameters, communicator, options);
}

}  // namespace mltrain
