#include "trainer/optim/clipping.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace mltrain {
namespace {

at::Tensor global_norm(const ReducedGradients& gradients) {
  if (gradients.ranks == nullptr)
    return at::stack(at::_foreach_norm(gradients.tensors, 2)).to(at::kFloat).norm();
  // ZeRO-1's padding past the last parameter is zero, and adds nothing.
  const at::Tensor squares =
      at::stack(at::_foreach_norm(gradients.tensors, 2)).to(at::kDouble).square().sum();
  gradients.ranks->all_reduce_average(squares)->wait();
  return (squares * gradients.ranks->size()).sqrt().to(at::kFloat);
}

}  // namespace

at::Tensor clip_by_global_norm(const ReducedGradients& gradients, double max_norm) {
  at::NoGradGuard no_grad;
  const at::Tensor norm = global_norm(gradients);
  if (max_norm > 0.0) {
    // The scale in double, as a host max_norm / (norm + 1e-6) would be, applied in float.
    at::_foreach_mul_(gradients.tensors,
                      (max_norm / (norm.to(at::kDouble) + 1e-6)).clamp_max(1.0).to(at::kFloat));
  }
  return norm;
}

}  // namespace mltrain
