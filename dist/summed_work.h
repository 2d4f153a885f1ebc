#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "dist/communicator.h"

namespace mltrain {

// A collective of a CPU backend (MPI, Gloo), which sums where the caller asked for an average:
// wait() runs `complete`, which blocks until the operation is done or throws naming it, then
// divides `average`, when given, by the number of ranks. The tensors in `in_flight`, which the
// operation reads or writes, stay alive until the work is dropped.
class SummedWork : public CollectiveWork {
 public:
  SummedWork(std::function<void()> complete, at::Tensor average, int world_size,
             std::vector<at::Tensor> in_flight)
      : complete_(std::move(complete)),
        average_(std::move(average)),
        world_size_(world_size),
        in_flight_(std::move(in_flight)) {}

  void wait() override {
    complete_();
    if (average_.defined()) average_.div_(world_size_);
  }

 private:
  std::function<void()> complete_;
  at::Tensor average_;
  int world_size_;
  std::vector<at::Tensor> in_flight_;
};

}  // namespace mltrain
