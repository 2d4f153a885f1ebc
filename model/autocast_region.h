#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

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

}  // namespace mltrain
