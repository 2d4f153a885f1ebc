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

// `settings` in force while it lives, and the caller's again when it ends. As at torch.autocast's
// exit, the outermost region to end drops the cache of casted weights: outside autocast nothing
// else would, and the copies would outlive the optimizer step that makes them stale.
class AutocastRegion {
 public:
  explicit AutocastRegion(const AutocastSettings& settings);
  ~AutocastRegion();
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  AutocastSettings previous_;
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
