#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace mltrain {

// The autocast settings of one device type.
struct AutocastSettings {
  c10::DeviceType device_type;
  bool enabled;
  c10::ScalarType dtype;
  bool cache_enabled;

  // The settings in force now.
  static AutocastSettings now(c10::DeviceType device_type);
};

// Keeps autocast's casts of the weights from one autocast region to the next while it lives, and
// drops them when it ends. Held over the micro-steps of one optimizer step, it makes one bf16
// cast of each weight serve every micro-step's forward pass, where each AutocastGuard alone would
// cast them again: the weights do not change until the optimizer steps, after it ends. (The cached
// cast's autograd node holds no tensor, so each micro-step's backward runs through it again.) The
// casts then live through backward: not for activation checkpointing, which frees them to save
// memory and recomputes on autograd's own threads on CUDA, whose regions would drop the cache.
class WeightCastCache {
 public:
  WeightCastCache();
  ~WeightCastCache();
  WeightCastCache(const WeightCastCache&) = delete;
  WeightCastCache& operator=(const WeightCastCache&) = delete;
};

// `settings` in force while it lives, and the caller's again when it ends. As at torch.autocast's
// exit, the outermost region (or WeightCastCache) to end drops the cache of casted weights:
// outside autocast nothing else would, and the copies would outlive the optimizer step that makes
// them stale.
class AutocastRegion {
 public:
  explicit AutocastRegion(const AutocastSettings& settings);
  ~AutocastRegion();
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  AutocastSettings previous_;
  WeightCastCache casts_;  // its casts, kept while it lives
};

// Mixed precision for the forward pass: with train.precision bf16, matmuls and attention run in
// bf16 under autocast while the weights, the optimizer state and the loss stay fp32. Constructed
// around the forward pass only (backward replays the recorded dtypes), it enables autocast for the
// device with an explicit dtype and, when it ends, restores the previous state and clears the
// autocast cache of casted weights, which are stale once the optimizer steps.
class AutocastGuard {
 public:
  AutocastGuard(c10::Device device, bool enabled);

 private:
  std::optional<AutocastRegion> region_;  // none when not enabled
};

}  // namespace mltrain
