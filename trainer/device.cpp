#include "trainer/device.h"

#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/cuda.h>

#include <array>
#include <string_view>
#include <utility>

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

c10::Device rank_device(const std::string& setting, const World& world) {
  const c10::Device device = resolve_device(setting);
  if (!device.is_cuda()) return device;
  const auto visible = static_cast<int64_t>(torch::cuda::device_count());
  if (world.local_rank >= visible) {
    throw UserError(
        fmt::format("{} ranks on this node but only {} visible GPUs: start one rank per GPU",
                    world.local_size, visible));
  }
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank)};
}

std::string describe_device(const c10::Device& device) {
  if (device.is_cpu()) return fmt::format("CPU ({} threads)", at::get_num_threads());
  return fmt::format("CUDA {}: {}", device.index(),
                     at::cuda::getDeviceProperties(device.index())->name);
}

double peak_bf16_flops(const c10::Device& device) {
  if (!device.is_cuda()) return 0.0;
  // The first entry whose key is part of the device name wins: longer names first.
  constexpr std::array<std::pair<std::string_view, double>, 9> kPeaks{{
      {"H200", 989e12},
      {"H100 PCIe", 756e12},
      {"H100", 989e12},
      {"A100", 312e12},
      {"L40S", 362e12},
      {"A10G", 70e12},
      {"L4", 121e12},
      {"RTX 4090", 165e12},
      {"RTX 3090", 71e12},
  }};
  const std::string_view name = at::cuda::getDeviceProperties(device.index())->name;
  for (const auto& [key, flops] : kPeaks) {
    if (name.find(key) != std::string_view::npos) return flops;
  }
  return 0.0;
}

int64_t peak_memory_bytes(const c10::Device& device) {
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  }
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace mltrain
