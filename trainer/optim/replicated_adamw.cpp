#include "trainer/optim/replicated_adamw.h"

namespace mltrain {
ReplicatedAdamW::ReplicatedAdamW(const NamedParameters& parameters, Communicator& communicator,
                                 const DataParallelOptions& options)
    : parameters_(tensors_of(parameters)),
      reducer_(parameters_, assign_buckets(parameters_, options.buckets), communicator,
               {.overlap = options.overlap, .compress_bf16 = options.compress_bf16}),
      adamw_(parameters, options.adamw) {}

ReducedGradients ReplicatedAdamW::reduce_gradients() {
  reducer_.finish();
  std::vector<at::Tensor> grads;
  grads.reserve(parameters_.size());
  for (const at::Tensor& parameter : parameters_) grads.push_back(parameter.grad());
  return {std::move(grads)};
}

void ReplicatedAdamW::update(double lr, const at::Tensor& skip) {
  adamw_.step(lr, skip);
  reducer_.zero_grad();
}

}  // namespace mltrain
