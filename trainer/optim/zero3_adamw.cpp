#include "trainer/optim/zero3_adamw.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mltrain {
namespace {

// Where each position of the model's forward reads: a unit of its own, or the unit of a tensor
// an earlier position read (a tied embedding), so that every parameter is in exactly one unit.
struct UnitAssignment {
  std::vector<std::vector<size_t>> units;  // indices into the parameters, per unit
  std::vector<size_t> order;               // the unit of each position
};

UnitAssignment assign_units(const std::vector<at::Tensor>& parameters,
                            const UnitParameters& positions) {
  const auto index_of = [&](const at::Tensor& tensor) {
    for (size_t i = 0; i < parameters.size(); ++i)
      if (parameters[i].unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) return i;
    throw std::invalid_argument("Zero3AdamW: a unit reads a tensor that is not a parameter");
  };
  UnitAssignment assignment;
  std::vector<std::optional<size_t>> unit_of(parameters.size());
  for (const std::vector<at::Tensor>& tensors : positions) {
    std::optional<size_t> unit;
    for (const at::Tensor& tensor : tensors) {
      const std::optional<size_t> earlier = unit_of[index_of(tensor)];
      if (earlier && unit && *earlier != *unit)
        throw std::invalid_argument("Zero3AdamW: a unit reads the tensors of two others");
      if (earlier) unit = earlier;
    }
    if (!unit) {
      unit = assignment.units.size();
      assignment.units.emplace_back();
    }
    for (const at::Tensor& tensor : tensors) {
      const size_t i = index_of(tensor);
      if (unit_of[i]) continue;
      unit_of[i] = unit;
      assignment.units[*unit].push_back(i);
    }
    assignment.order.push_back(*unit);
  }
  for (const std::optional<size_t>& unit : unit_of)
    if (!unit) throw std::invalid_argument("Zero3AdamW: a parameter that no unit reads");
  return assignment;
}

std::shared_ptr<UnitShards> shards_of(const NamedParameters& parameters,
                                      const UnitParameters& positions, Communicator& communicator,
                                      bool gather_bf16) {
  const std::vector<at::Tensor> tensors = tensors_of(parameters);
  UnitAssignment assignment = assign_units(tensors, positions);
  return std::make_shared<UnitShards>(
      tensors, lay_out_units(tensors, assignment.units, communicator.size()),
      std::move(assignment.order), communicator, gather_bf16 ? at::kBFloat16 : at::kFloat);
}

std::vector<BucketLayout> unit_layouts(const UnitShards& shards) {
  std::vector<BucketLayout> layouts;
  for (size_t u = 0; u < shards.units(); ++u) layouts.push_back(shards.layout(u));
  return layouts;
}

// The units in backward's order, the last first: the reducer's buckets.
std::vector<BucketLayout> backward_buckets(const UnitShards& shards) {
  std::vector<BucketLayout> buckets = unit_layouts(shards);
  std::reverse(buckets.begin(), buckets.end());
  return buckets;
}

// The model's unit hooks: each position's unit whole while it runs forward, and again before its
// backward where that reads the unit's parameters, from a hook on its output's gradient (which
// autograd calls once the gradient of everything after the unit is known, before the unit's own
// backward).
class ShardedUnitHooks : public UnitHooks {
 public:
  explicit ShardedUnitHooks(std::shared_ptr<UnitShards> shards) : shards_(std::move(shards)) {}

  void before_forward(size_t position) override { shards_->before_forward(position); }

  at::Tensor after_forward(size_t position, const at::Tensor& output,
                           bool backward_reads_parameters) override {
    const bool backward_follows = output.requires_grad();
    shards_->after_forward(position, backward_follows, backward_reads_parameters);
    if (backward_follows && backward_reads_parameters) {
      output.register_hook(
          [shards = shards_, position](const at::Tensor&) { shards->before_backward(position); });
    }
    return output;
  }

 private:
  std::shared_ptr<UnitShards> shards_;
};

}  // namespace

Zero3AdamW::Zero3AdamW(const NamedParameters& parameters, const UnitParameters& units,
                       Communicator& communicator, const DataParallelOptions& options)
    : communicator_(communicator),
      shards_(shards_of(parameters, units, communicator, options.gather_bf16)),
      reducer_(
          tensors_of(parameters), backward_buckets(*shards_), communicator,
          {.overlap = options.overlap,
           .compress_bf16 = options.compress_bf16,
           .scatter = true,
           .release_buckets = true,
           .on_bucket_complete = [this](size_t bucket) { shards_->release(bucket_of(bucket)); }}),
      adamw_(parameters, unit_layouts(*shards_), parts_of_units(), communicator, options.adamw),
      hooks_(std::make_shared<ShardedUnitHooks>(shards_)) {}

// This rank's part of each unit: the shards' weights, and the reducer's averaged gradients of the
// unit's bucket.
std::vector<PartsAdamW::Part> Zero3AdamW::parts_of_units() const {
  std::vector<PartsAdamW::Part> parts;
  for (size_t u = 0; u < shards_->units(); ++u) {
    parts.push_back({.begin = shards_->part_begin(u),
                     .weights = shards_->part(u),
                     .gradients = reducer_.averaged_parts()[bucket_of(u)]});
  }
  return parts;
}

std::optional<SafetensorsShare> Zero3AdamW::weights_share() const {
  SafetensorsShare share;
  // The weights as the parts keep them, whatever dtype the units are gathered in.
  for (const NamedParameter& parameter : adamw_.parameters())
    add_part_entries(share.entries, parameter, "", shards_->part(0).scalar_type());
  if (!writes_its_parts(communicator_)) return share;
  for (size_t u = 0; u < shards_->units(); ++u) {
    for (TensorPiece& piece : pieces_of_part(adamw_.parameters(), shards_->layout(u),
                                             shards_->part_begin(u), shards_->part(u), ""))
      share.pieces.push_back(std::move(piece));
  }
  return share;
}

std::vector<at::Tensor> Zero3AdamW::weight_parts() const {
  std::vector<at::Tensor> parts;
  for (size_t u = 0; u < shards_->units(); ++u) parts.push_back(shards_->part(u));
  return parts;
}

void Zero3AdamW::set_sync(bool last_micro_step) {
  // The micro-step before is over: whatever its backward left whole goes.
  shards_->release_all();
  reducer_.set_sync(last_micro_step);
}

ReducedGradients Zero3AdamW::reduce_gradients() {
  if (reduced_) throw std::logic_error("Zero3AdamW::reduce_gradients twice in one step");
  reducer_.finish();
  shards_->release_all();
  reduced_ = true;
  return {reducer_.averaged_parts(), &communicator_};
}

void Zero3AdamW::update(double lr, const at::Tensor& skip) {
  if (!reduced_) throw std::logic_error("Zero3AdamW::update before reduce_gradients");
  adamw_.step(lr, skip);
  reducer_.zero_grad();
  reduced_ = false;
}

}  // namespace mltrain
