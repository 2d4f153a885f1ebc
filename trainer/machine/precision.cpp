#include "trainer/machine/precision.h"

#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>
#include <spdlog/spdlog.h>

#include <stdexcept>
#include <string>

#include "common/error.h"

namespace mltrain {

namespace {

bool cpu_has(const char* flag) {
  const auto capabilities = at::cpu::get_cpu_capabilities();
  const auto found = capabilities.find(flag);
  return found != capabilities.end() && found->second.isBool() && found->second.toBool();
}

// What the log says of a device's bf16, and whether bf16 runs faster than fp32 there.
struct Bf16Speed {
  std::string why;
  bool faster_than_fp32;
};

Bf16Speed bf16_on(c10::Device device, CpuBf16 cpu_bf16) {
  if (!device.is_cpu()) return {"bf16 tensor cores on " + device.str(), true};
  switch (cpu_bf16) {
    case CpuBf16::amx:
      return {"this CPU has AMX-BF16, where bf16 products run several times the fp32 rate", true};
    case CpuBf16::avx512_bf16:
      return {"this CPU has AVX512-BF16 without AMX-BF16, where bf16 products run slower than fp32",
              false};
    case CpuBf16::emulated:
      return {
          "this CPU has neither AMX-BF16 nor AVX512-BF16: bf16 is emulated, tens of times "
          "slower than fp32",
          false};
  }
  throw std::logic_error("unknown CpuBf16");
}

}  // namespace

CpuBf16 cpu_bf16_support() {
  if (cpu_has("amx_bf16") && at::cpu::init_amx()) return CpuBf16::amx;
  if (cpu_has("avx512_bf16")) return CpuBf16::avx512_bf16;
  return CpuBf16::emulated;
}

PrecisionChoice choose_precision(const std::string& precision, c10::Device device,
                                 CpuBf16 cpu_bf16) {
  if (precision == "fp32") return {false, false, "train.precision: fp32"};
  const auto [why, bf16_faster] = bf16_on(device, cpu_bf16);
  if (precision == "bf16") {
    if (bf16_faster) return {true, false, "train.precision: bf16"};
    return {
        true, true,
        "train.precision: bf16, though " + why + "; train.precision: auto or fp32 takes fp32 here"};
  }
  if (precision != "auto") {
    throw UserError("train.precision is auto, bf16 or fp32, not '" + precision + "'");
  }
  return {bf16_faster, false, "train.precision: auto, " + why};
}

PrecisionChoice precision_on_this_machine(const std::string& precision, c10::Device device) {
  return choose_precision(precision, device, cpu_bf16_support());
}

void log_precision(const PrecisionChoice& choice) {
  const char* taken = choice.bf16 ? "bf16 autocast, fp32 weights" : "fp32";
  if (choice.slower_than_fp32) {
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
