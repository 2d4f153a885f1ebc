#pragma once

#include <ATen/Tensor.h>

#include <stdexcept>
#include <utility>
#include <vector>

#include "dist/grad_reducer.h"
#include "trainer/optim/optimizer.h"

namespace mltrain {

// The gradients of every parameter, all-reduced over the ranks while backward runs (as DDP), for
// the optimizers that update whole parameters on every rank: each rank ends a step with every
// gradient averaged. Checks that a step reduces once before it updates.
class ReplicatedGradients {
 public:
  ReplicatedGradients(std::vector<at::Tensor> parameters, Communicator& communicator,
                      const DataParallelOptions& options)
      : parameters_(std::move(parameters)),
        reducer_(parameters_, assign_buckets(parameters_, options.buckets), communicator,
                 {.overlap = options.overlap, .compress_bf16 = options.compress_bf16}) {}

  void set_sync(bool last_micro_step) { reducer_.set_sync(last_micro_step); }

  // Waits until every gradient is averaged over the ranks, and returns them (.grad, in the order
  // of the parameters).
  ReducedGradients reduce() {
    if (reduced_) throw std::logic_error("the gradients were reduced twice in one step");
    reducer_.finish();
    reduced_ = true;
    std::vector<at::Tensor> grads;
    grads.reserve(parameters_.size());
    for (const at::Tensor& parameter : parameters_) grads.push_back(parameter.grad());
    return {std::move(grads)};
  }

  // Before an update: before the reduction each rank holds its own gradients, and the ranks would
  // drift apart.
  void check_reduced() const {
    if (!reduced_) throw std::logic_error("an update before the gradients were reduced");
  }

  // After the update: the gradients at zero for the next step.
  void zero() {
    reducer_.zero_grad();
    reduced_ = false;
  }

 private:
  std::vector<at::Tensor> parameters_;
  GradReducer reducer_;
  bool reduced_ = false;  // reduce() ran since the last zero()
};

}  // namespace mltrain
