#include "trainer/optim/replicated_adamw.h"

namespace mltrain {

ReplicatedAdamW::ReplicatedAdamW(const NamedParameters& parameters, Communicator& communicator,
                                 const DataParallelOptions& options)
    : gradients_(tensors_of(parameters), communicator, options),
      adamw_(parameters, options.adamw) {}

void ReplicatedAdamW::update(double lr, const at::Tensor& skip) {
  gradients_.check_reduced();
  adamw_.step(lr, skip);
  gradients_.zero();
}

}  // namespace mltrain
