#include "model/layers/lora.h"

#include <ATen/ATen.h>

#include <utility>

namespace mltrain {

LowRankAdapterImpl::LowRankAdapterImpl(int64_t rows, int64_t columns, std::vector<Target> targets,
                                       const LoraConfig& lora, const WeightOptions& options)
    : rows_(rows), targets_(std::move(targets)), scale_(lora.scale()) {
  const WeightOptions undrawn{.tensor = options.tensor, .bytes = options.bytes, .drawn = false};
  for (const Target& target : targets_) {
    a_.push_back(register_parameter(target.name + "_A", undrawn.make({lora.rank, columns})));
    b_.push_back(register_parameter(target.name + "_B", undrawn.make({target.rows, lora.rank})));
  }
}

at::Tensor LowRankAdapterImpl::add_to(const at::Tensor& x, const at::Tensor& projected) const {
  std::vector<at::Tensor> deltas;
  for (size_t t = 0; t < targets_.size(); ++t)
    deltas.push_back(at::linear(at::linear(x, a_[t]) * scale_, b_[t]));
  // The rows no adapter targets add nothing: zeros between the targets' products.
  std::vector<at::Tensor> pieces;
  std::vector<int64_t> gap_shape = projected.sizes().vec();
  int64_t row = 0;
  const auto gap_to = [&](int64_t end) {
    if (end == row) return;
    gap_shape.back() = end - row;
    pieces.push_back(at::zeros(gap_shape, deltas.front().options()));
  };
  for (size_t t = 0; t < targets_.size(); ++t) {
    gap_to(targets_[t].first_row);
    pieces.push_back(deltas[t]);
    row = targets_[t].first_row + targets_[t].rows;
  }
  gap_to(rows_);
  return projected + (pieces.size() == 1 ? pieces.front() : at::cat(pieces, -1));
}

void LowRankAdapterImpl::merge_into(const at::Tensor& weight) const {
  at::NoGradGuard no_grad;
  for (size_t t = 0; t < targets_.size(); ++t) {
    weight.narrow(0, targets_[t].first_row, targets_[t].rows)
        .add_(at::mm(b_[t], a_[t]).to(weight.scalar_type()), scale_);
  }
}

LowRankAdapter adapter_for(int64_t columns,
                           const std::vector<std::pair<std::string, int64_t>>& parts,
                           const LoraConfig& lora, const WeightOptions& options) {
  if (!lora.enabled()) return nullptr;
  std::vector<LowRankAdapterImpl::Target> targets;
  int64_t rows = 0;
  for (const auto& [name, part_rows] : parts) {
    if (lora.adapts(name)) targets.push_back({.name = name, .first_row = rows, .rows = part_rows});
    rows += part_rows;
  }
  if (targets.empty()) return nullptr;
  return LowRankAdapter(rows, columns, std::move(targets), lora, options);
}

}  // namespace mltrain
