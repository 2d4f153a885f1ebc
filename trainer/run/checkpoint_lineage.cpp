#include "trainer/run/checkpoint_lineage.h"

#include <algorithm>

namespace mltrain {

CheckpointLineage::CheckpointLineage(std::optional<int64_t> resumed_step)
    : last_applied_(resumed_step.value_or(0)) {
  if (resumed_step) segment_.insert(*resumed_step);
}

void CheckpointLineage::applied(int64_t step) {
  last_applied_ = step;
  rolled_back_to_.reset();
  for (const int64_t checkpoint : segment_) {
    if (checkpoint < step) confirmed_.insert(checkpoint);
  }
}

void CheckpointLineage::saved(int64_t step) {
  segment_.insert(step);
  // A checkpoint saved anew at a step holds other weights than the one before it there.
  confirmed_.erase(step);
}

std::optional<int64_t> CheckpointLineage::confirmed() const {
  if (confirmed_.empty()) return std::nullopt;
  return *confirmed_.rbegin();
}

bool CheckpointLineage::was_tried(int64_t step) const {
  return std::find(tried_.begin(), tried_.end(), step) != tried_.end();
}

CheckpointLineage::Rollback CheckpointLineage::roll_back(const std::vector<int64_t>& available) {
  Rollback rollback;
  if (rolled_back_to_ && !confirmed_.contains(*rolled_back_to_))
    rollback.bad.push_back(*rolled_back_to_);
  for (const int64_t step : available) {
    if (step > last_applied_ || was_tried(step)) continue;
    if (!rollback.target || step > *rollback.target) rollback.target = step;
  }
  if (!rollback.target) {
    for (const int64_t step : segment_) {
      if (!confirmed_.contains(step) && step != rolled_back_to_) rollback.bad.push_back(step);
    }
  }
  segment_.clear();
  rolled_back_to_ = rollback.target;
  if (rollback.target) {
    tried_.push_back(*rollback.target);
    segment_.insert(*rollback.target);
    last_applied_ = *rollback.target;
  }
  return rollback;
}

std::optional<int64_t> CheckpointLineage::newest_good(const std::vector<int64_t>& available) const {
  std::optional<int64_t> newest;
  for (const int64_t step : available) {
    if (confirmed_.contains(step) && (!newest || step > *newest)) newest = step;
  }
  return newest;
}

}  // namespace mltrain
