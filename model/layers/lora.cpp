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

// In two products for all the targets: x [.., columns] by every A at once ([T·rank, columns], the
// targets' A one after another), then by B laid out block-diagonally at the targets' rows ([rows,
// T·rank], zeros elsewhere), added to `projected` inside the second product (addmm): no product
// or sum of each target's own, and no zeros of the rows that no adapter targets.
at::Tensor LowRankAdapterImpl::add_to(const at::Tensor& x, const at::Tensor& projected) const {
  const at::Tensor a = a_.size() == 1 ? a_.front() : at::cat(a_, 0);
  const at::Tensor stacked = b_.size() == 1 ? b_.front() : at::block_diag(b_);
  std::vector<at::Tensor> rows;
  int64_t row = 0;
  int64_t stacked_row = 0;
  for (const Target& target : targets_) {
    if (target.first_row > row)
      rows.push_back(at::zeros({target.first_row - row, stacked.size(1)}, stacked.options()));
    rows.push_back(stacked.narrow(0, stacked_row, target.rows));
    stacked_row += target.rows;
    row = target.first_row + target.rows;
  }
  if (rows_ > row) rows.push_back(at::zeros({rows_ - row, stacked.size(1)}, stacked.options()));
  const at::Tensor b = rows.size() == 1 ? rows.front() : at::cat(rows, 0);
  const at::Tensor xa = at::mm(x.reshape({-1, x.size(-1)}), a.t());
  return at::addmm(projected.reshape({-1, rows_}), xa, b.t(), /*beta=*/1, /*alpha=*/scale_)
      .view(projected.sizes());
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
