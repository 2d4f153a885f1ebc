#include "trainer/device.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "common/error.h"

namespace mltrain {

c10::Device resolve_device(const std::string& setting) {
  const bool cuda = torch::cuda::is_available();
  if (setting == "cuda" && !cuda) {
    throw UserError("train.device is cuda but no CUDA device is visible: use cpu or auto");
  }
  if (setting == "cpu" || !cuda) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, 0);
}

std::string describe_device(const c10::Device& device) {
  if (device.is_cpu()) return fmt::format("CPU ({} threads)", at::get_num_threads());
  return fmt::format("CUDA {}", device.index());
}

}  // namespace mltrain
