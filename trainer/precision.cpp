#include "trainer/precision.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/cpu/Utils.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace mltrain {

AutocastGuard::AutocastGuard(c10::Device device, bool enabled)
    : device_type_(device.type()), enabled_(enabled) {
  if (!enabled_) return;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_dtype(device_type_, at::kBFloat16);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // As torch.autocast's __exit__: the outermost exit drops the cache of casted weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

at::Tensor window_loss(Llama& model, const at::Tensor& window, c10::Device device, bool bf16) {
  const int64_t length = window.size(1) - 1;
  const AutocastGuard autocast(device, bf16);
  return model->loss(window.narrow(1, 0, length), window.narrow(1, 1, length));
}

bool cpu_has_bf16_units() {
  const auto capabilities = at::cpu::get_cpu_capabilities();
  for (const char* unit : {"amx_bf16", "avx512_bf16"}) {
    const auto found = capabilities.find(unit);
    if (found != capabilities.end() && found->second.isBool() && found->second.toBool())
      return true;
  }
  return false;
}

PrecisionChoice choose_precision(const std::string& precision, c10::Device device,
                                 bool cpu_bf16_units) {
  const bool fast_bf16 = !device.is_cpu() || cpu_bf16_units;
  const std::string units =
      device.is_cpu() ? (cpu_bf16_units ? "this CPU has bf16 units (AMX-BF16 or AVX512-BF16)"
                                        : "this CPU has no bf16 units (AMX-BF16 or "
                                          "AVX512-BF16)")
                      : "bf16 tensor cores on " + device.str();
  if (precision == "fp32") return {false, false, "train.precision: fp32"};
  if (precision == "bf16") {
    if (fast_bf16) return {true, false, "train.precision: bf16"};
    return {true, true,
            "train.precision: bf16, but " + units +
                ": autocast runs emulated, slower than fp32 (train.precision: auto or fp32 picks "
                "fp32 here)"};
  }
  if (precision != "auto") {
    throw UserError("train.precision is auto, bf16 or fp32, not '" + precision + "'");
  }
  return {fast_bf16, false, "train.precision: auto, " + units};
}

PrecisionChoice precision_on_this_machine(const std::string& precision, c10::Device device) {
  return choose_precision(precision, device, device.is_cpu() && cpu_has_bf16_units());
}

void log_precision(const PrecisionChoice& choice) {
  const char* taken = choice.bf16 ? "bf16 autocast, fp32 weights" : "fp32";
  if (choice.emulated) {
    spdlog::warn("precision: {} ({})", taken, choice.reason);
  } else {
    spdlog::info("precision: {} ({})", taken, choice.reason);
  }
}

bool use_bf16_autocast(const std::string& precision, c10::Device device) {
  const PrecisionChoice choice = precision_on_this_machine(precision, device);
  log_precision(choice);
  return choice.bf16;
}

}  // namespace mltrain
