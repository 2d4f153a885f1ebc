#include "trainer/optim/muon_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

namespace mltrain {
namespace {

NamedParameters adamw_parameters(const NamedParameters& parameters) {
  NamedParameters rest;
  for (const NamedParameter& parameter : parameters)
    if (!updated_by_muon(parameter)) rest.push_back(parameter);
  return rest;
}

// The owner of each of the matrices with `sizes` elements among `ranks`: largest first, each to
// the rank that owns the fewest elements so far (the lowest such rank), as every rank computes it.
std::vector<int> deal_matrices(const std::vector<int64_t>& sizes, int ranks) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int64_t> owned(ranks, 0);
  std::vector<int> owners(sizes.size(), 0);
  for (const size_t i : order) {
    const auto rank =
        static_cast<int>(std::min_element(owned.begin(), owned.end()) - owned.begin());
    owners[i] = rank;
    owned[rank] += sizes[i];
  }
  return owners;
}

}  // namespace

bool updated_by_muon(const NamedParameter& parameter) {
  return parameter.tensor.dim() == 2 && parameter.name.starts_with("model.layers.");
}

MuonOptimizer::MuonOptimizer(const NamedParameters& parameters, Communicator& communicator,
                             const DataParallelOptions& options)
    : communicator_(communicator),
      sharded_(options.zero1),
      muon_lr_ratio_(options.muon_lr_ratio),
      gradients_(tensors_of(parameters), communicator, options),
      adamw_(adamw_parameters(parameters), options.adamw),
      muon_(options.muon.value()) {
  std::vector<int64_t> sizes;
  for (const NamedParameter& parameter : parameters) {
    if (!updated_by_muon(parameter)) continue;
    matrices_.push_back({.parameter = parameter, .owner = 0, .momentum = {}});
    sizes.push_back(parameter.tensor.numel());
  }
  const std::vector<int> owners = deal_matrices(sizes, sharded_ ? communicator_.size() : 1);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& matrix = matrices_[i];
    matrix.owner = sharded_ ? owners[i] : communicator_.rank();
    if (!owns(matrix)) continue;
    const at::Tensor& weight = matrix.parameter.tensor;
    matrix.momentum = at::zeros_like(weight, at::MemoryFormat::Contiguous);
    std::vector<int64_t> rows;
    for (const ParameterPart& part : matrix.parameter.parts) rows.push_back(part.rows);
    muon_.add(weight, matrix.momentum, std::move(rows));
  }
}

void MuonOptimizer::update(double lr, const at::Tensor& skip) {
  gradients_.check_reduced();
  adamw_.step(lr, skip);
  muon_.step(lr * muon_lr_ratio_, skip);
  if (sharded_) {
    at::NoGradGuard no_grad;
    for (const Matrix& matrix : matrices_)
      communicator_.broadcast(matrix.parameter.tensor, matrix.owner);
  }
  gradients_.zero();
}

OptimizerState MuonOptimizer::state() const {
  const bool keep = !sharded_ || communicator_.run_rank() == 0;
  OptimizerState state;
  if (keep) state = adamw_.state();
  for (const Matrix& matrix : matrices_) {
    at::Tensor momentum = matrix.momentum;
    if (sharded_) {
      // From its owner to rank 0, through a broadcast: the communicator has no send.
      momentum = owns(matrix) ? momentum.clone() : at::zeros_like(matrix.parameter.tensor);
      communicator_.broadcast(momentum, matrix.owner);
      if (keep) momentum = momentum.to(at::kCPU);
    }
    if (keep) add_by_part(state, matrix.parameter, momentum, ".momentum");
  }
  return state;
}

void MuonOptimizer::load_state(const OptimizerState& saved, const std::string& source) {
  // Everything is checked before anything changes.
  for (const Matrix& matrix : matrices_)
    check_saved_parts(saved, matrix.parameter, ".momentum", source);
  adamw_.load_state(saved, source);
  for (const Matrix& matrix : matrices_)
    if (owns(matrix)) copy_saved_parts(saved, matrix.parameter, ".momentum", matrix.momentum);
}

int64_t MuonOptimizer::state_bytes() const {
  int64_t bytes = adamw_.state_bytes();
  for (const Matrix& matrix : matrices_)
    if (owns(matrix)) bytes += static_cast<int64_t>(matrix.momentum.nbytes());
  return bytes;
}

}  // namespace mltrain
