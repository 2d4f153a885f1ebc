#include "trainer/optim/muon.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

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

void MuonUpdate::add(const at::Tensor& weight, const at::Tensor& momentum,
                     std::vector<int64_t> rows) {
  if (std::accumulate(rows.begin(), rows.end(), int64_t{0}) != weight.size(0))
    throw std::logic_error("MuonUpdate: the matrices' rows do not add up to the parameter's");
  entries_.push_back({weight, momentum, std::move(rows)});
}

at::Tensor MuonUpdate::scaled_update(const at::Tensor& nesterov,
                                     const std::vector<int64_t>& rows) const {
  // On CUDA the products run at the bf16 rate; on the CPU fp32 is the faster of the two except
  // with AMX, and the exact one.
  const at::Tensor input = nesterov.is_cuda() ? nesterov.to(at::kBFloat16) : nesterov;
  std::vector<at::Tensor> updates;
  int64_t first_row = 0;
  for (const int64_t matrix_rows : rows) {
    const at::Tensor matrix = input.narrow(0, first_row, matrix_rows);
    updates.push_back(newton_schulz(matrix, options_.ns_steps)
                          .to(nesterov.scalar_type())
                          .mul_(muon_update_scale(matrix_rows, matrix.size(1))));
    first_row += matrix_rows;
  }
  return updates.size() == 1 ? updates.front() : at::cat(updates);
}

void MuonUpdate::step(double lr, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const double mu = options_.momentum;
  const at::Tensor applied = skip.eq(0);
  for (Entry& entry : entries_) {
    const at::Tensor grad = entry.weight.grad();
    const at::Tensor next_momentum = at::add(grad, entry.momentum, mu);
    const at::Tensor nesterov = at::add(grad, next_momentum, mu);
    const at::Tensor next_weight = at::add(entry.weight * (1.0 - lr * options_.weight_decay),
                                           scaled_update(nesterov, entry.rows), -lr);
    // A skipped step (a non-finite gradient, a loss spike) leaves both as they were: a select,
    // as any arithmetic with the skip flag would carry a NaN through.
    entry.momentum.copy_(at::where(applied, next_momentum, entry.momentum));
    entry.weight.copy_(at::where(applied, next_weight, entry.weight));
  }
}

}  // namespace mltrain
