#include "trainer/optim/replicated_adamw.h"

#include <stdexcept>

namespace mltrain {
ReplicatedAdamW::ReplicatedAdamW(const NamedParameters& parameters, Communicator& communicator,
                                 const DataParallelOptions& options)
    : parameters_(tensors_of(parameters)),
      reducer_(parameters_, assign_buckets(parameters_, options.buckets), communicator,
               {.overlap = options.overlap, .compress_bf16 = options.compress_bf16}),
      adamw_(parameters, options.adamw) {}

ReducedGradients ReplicatedAdamW::reduce_gradients() {
  if (reduced_) throw std::logic_error("ReplicatedAdamW::reduce_gradients twice in one step");
  reducer_.finish();
  reduced_ = true;
  std::vector<at::Tensor> grads;
  grads.reserve(parameters_.size());
  for (const at::Tensor& parameter : parameters_) grads.push_back(parameter.grad());
  return {std::move(grads)};
}

void ReplicatedAdamW::update(double lr, const at::Tensor& skip) {
  // Before the reduction each rank holds its own gradients: the ranks would drift apart.
  if (!reduced_) throw std::logic_error("ReplicatedAdamW::update before reduce_gradients");
  adamw_.step(lr, skip);
  reducer_.zero_grad();
  reduced_ = false;
}

}  // namespace mltrain
