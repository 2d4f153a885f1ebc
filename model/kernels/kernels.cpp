#include "model/kernels/kernels.h"

#include <fmt/format.h>

#include "common/error.h"
#include "model/kernels/cpu_kernels.h"
#include "model/kernels/cuda_kernels.h"

namespace mltrain {

Kernels choose_kernels(const std::string& name, c10::Device device) {
  if (name == "aten") return Kernels::aten;
  if (name == "auto" || name == "fused") {
    return device.is_cpu() ? Kernels::fused_cpu : Kernels::aten;
  }
  if (name == "fused_cuda") {
    if (device.is_cpu()) return Kernels::fused_cpu;
    if (!device.is_cuda()) {
      throw UserError(fmt::format(
          "train.kernels: fused_cuda has no kernels for {}: use auto or aten", device.str()));
    }
    if (!cuda_kernels_built()) {
      throw UserError(
          "train.kernels: fused_cuda needs mltrain's CUDA kernels, which a build against a "
          "LibTorch without CUDA lacks: use auto or aten");
    }
    return Kernels::fused_cuda;
  }
  throw UserError(fmt::format("train.kernels is auto, fused, fused_cuda or aten, not '{}'", name));
}

const char* describe(Kernels kernels) {
  switch (kernels) {
    case Kernels::fused_cpu:
      return "fused CPU kernels";
    case Kernels::fused_cuda:
      return "fused CUDA kernels";
    case Kernels::aten:
      break;
  }
  return "aten";
}

bool runs_fused_cpu(Kernels kernels, const at::Tensor& input) {
  return runs_fused_cpu(kernels, input.device(), input.scalar_type());
}

bool runs_fused_cpu(Kernels kernels, c10::Device device, c10::ScalarType dtype) {
  return kernels == Kernels::fused_cpu && device.is_cpu() && fused_kernels_support(dtype);
}

bool runs_fused_cuda(Kernels kernels, const at::Tensor& input) {
  return runs_fused_cuda(kernels, input.device(), input.scalar_type());
}

bool runs_fused_cuda(Kernels kernels, c10::Device device, c10::ScalarType dtype) {
  return kernels == Kernels::fused_cuda && device.is_cuda() &&
         (dtype == at::kFloat || dtype == at::kBFloat16);
}

bool runs_fused(Kernels kernels, c10::Device device, c10::ScalarType dtype) {
  return runs_fused_cpu(kernels, device, dtype) || runs_fused_cuda(kernels, device, dtype);
}

}  // namespace mltrain
