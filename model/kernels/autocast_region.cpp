#include "model/kernels/autocast_region.h"

#include <ATen/autocast_mode.h>

namespace mltrain {
namespace {

void put_in_force(const AutocastSettings& settings) {
  at::autocast::set_autocast_enabled(settings.device_type, settings.enabled);
  at::autocast::set_autocast_dtype(settings.device_type, settings.dtype);
  at::autocast::set_autocast_cache_enabled(settings.cache_enabled);
}

}  // namespace

AutocastSettings AutocastSettings::now(c10::DeviceType device_type) {
  return {device_type, at::autocast::is_autocast_enabled(device_type),
          at::autocast::get_autocast_dtype(device_type), at::autocast::is_autocast_cache_enabled()};
}

// Autocast drops its cache when the outermost region ends; each of these counts as one.
WeightCastCache::WeightCastCache() { at::autocast::increment_nesting(); }

WeightCastCache::~WeightCastCache() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

AutocastRegion::AutocastRegion(const AutocastSettings& settings)
    : previous_(AutocastSettings::now(settings.device_type)) {
  put_in_force(settings);
}

// The caller's settings come back first, then casts_ ends (and drops the cache if outermost).
AutocastRegion::~AutocastRegion() { put_in_force(previous_); }

AutocastGuard::AutocastGuard(c10::Device device, bool enabled) {
  if (enabled) {
    region_.emplace(AutocastSettings{device.type(), true, at::kBFloat16,
                                     at::autocast::is_autocast_cache_enabled()});
  }
}

}  // namespace mltrain
