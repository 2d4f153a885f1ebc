#include "trainer/optim/muon.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

namespace mltrain {

at::Tensor newton_schulz(const at::Tensor& matrix, int64_t steps) {
  constexpr double a = 3.4445;
  constexpr double b = -4.7750;
  constexpr double c = 2.0315;
  // Wide, so that X X^T is the smaller of the two Gram matrices.
  const bool tall = matrix.size(0) > matrix.size(1);
  at::Tensor x = tall ? matrix.t() : matrix;
  x = x / (x.norm() + 1e-7);
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor gram = at::mm(x, x.t());
    const at::Tensor polynomial = at::addmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = at::addmm(x, polynomial, x, /*beta=*/a);
  }
  return tall ? x.t() : x;
}

double muon_update_scale(int64_t rows, int64_t cols) {
  return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

void MuonUpdate::add(const at::Tensor& weight, const at::Tensor& momentum) {
  weights_.push_back(weight);
  momenta_.push_back(momentum);
}

void MuonUpdate::step(double lr, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const double mu = options_.momentum;
  const at::Tensor applied = skip.eq(0);
  for (size_t i = 0; i < weights_.size(); ++i) {
    at::Tensor weight = weights_[i];
    at::Tensor momentum = momenta_[i];
    const at::Tensor grad = weight.grad();
    const at::Tensor next_momentum = at::add(grad, momentum, mu);
    const at::Tensor nesterov = at::add(grad, next_momentum, mu);
    // On CUDA the products run at the bf16 rate; on the CPU fp32 is the faster of the two except
    // with AMX, and the exact one.
    const at::Tensor input = nesterov.is_cuda() ? nesterov.to(at::kBFloat16) : nesterov;
    const at::Tensor orthogonal = newton_schulz(input, options_.ns_steps).to(weight.scalar_type());
    const at::Tensor next_weight = at::add(weight * (1.0 - lr * options_.weight_decay), orthogonal,
                                           -lr * muon_update_scale(weight.size(0), weight.size(1)));
    // A skipped step (a non-finite gradient, a loss spike) leaves both as they were: a select,
    // as any arithmetic with the skip flag would carry a NaN through.
    momentum.copy_(at::where(applied, next_momentum, momentum));
    weight.copy_(at::where(applied, next_weight, weight));
  }
}

}  // namespace mltrain
