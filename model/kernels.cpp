#include "model/kernels.h"

#include <fmt/format.h>

#include "common/error.h"
#include "model/cpu_kernels.h"

namespace mltrain {

Kernels choose_kernels(const std::string& name, c10::Device device) {
  if (name == "aten") return Kernels::aten;
  if (name == "fused") return device.is_cpu() ? Kernels::fused_cpu : Kernels::aten;
  throw UserError(fmt::format("train.kernels is fused or aten, not '{}'", name));
}

const char* describe(Kernels kernels) {
  return kernels == Kernels::fused_cpu ? "fused CPU kernels" : "aten";
}

bool runs_fused_cpu(Kernels kernels, const at::Tensor& input) {
  return runs_fused_cpu(kernels, input.device(), input.scalar_type());
}

bool runs_fused_cpu(Kernels kernels, c10::Device device, c10::ScalarType dtype) {
  return kernels == Kernels::fused_cpu && device.is_cpu() && fused_kernels_support(dtype);
}

}  // namespace mltrain
