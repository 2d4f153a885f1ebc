#include "trainer/machine/device.h"

#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "common/input_file.h"

namespace mltrain {

c10::Device resolve_device(const std::string& setting) {
  const bool cuda = torch::cuda::is_available();
  if (setting == "cuda" && !cuda) {
    // CUDA reports a driver older than the runtime as no devices at all, so both causes look the
    // same from here; name both.
    throw UserError(fmt::format(
        "train.device is cuda but no CUDA device is visible: either this machine has no GPU (or "
        "CUDA_VISIBLE_DEVICES hides it), or its NVIDIA driver is too old for CUDA {}.{}, which "
        "this build uses; to train on the CPU instead, add --set train.device=cpu",
        CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10));
  }
  if (setting == "cpu" || !cuda) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, 0);
}

c10::Device rank_device(const std::string& setting, const World& world) {
  const c10::Device device = resolve_device(setting);
  if (!device.is_cuda()) return device;
  const int64_t visible = at::cuda::getNumGPUs();
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

namespace {

// Dense, bf16 inputs, fp32 accumulate, in FLOP/s, by the name CUDA reports. The datasheets
// quote most of these with 2:4 sparsity; those are halved here. GeForce cards accumulate in fp32
// at half their fp16-accumulate rate, and that half is the number here.
//   NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 1,979 (sparse), H100 NVL 1,671 (sparse)
//   NVIDIA H100 PCIe GPU product brief (PB-11133-001): 1,513 (sparse)
//   NVIDIA H200 Tensor Core GPU datasheet: H200 SXM 1,979 (sparse), H200 NVL 1,671 (sparse)
//   NVIDIA GH200 Grace Hopper Superchip datasheet: 1,979 (sparse) | 990 (dense)
//   NVIDIA Blackwell (HGX B200) datasheet: B200 4.5 PFLOPS (sparse)
//   NVIDIA A100 Tensor Core GPU datasheet: 312 | 624 (sparse), every A100 40GB and 80GB part
//   NVIDIA L40S datasheet: 362.05 | 733 (sparse)
//   NVIDIA L40 datasheet: 181.05 | 362.1 (sparse)
//   NVIDIA L4 Tensor Core GPU datasheet: 242 (sparse)
//   NVIDIA A10 Tensor Core GPU datasheet: 125 | 250 (sparse)
//   NVIDIA Ada GPU Architecture whitepaper, RTX 4090: 165.2 with fp32 accumulate (330.3 fp16)
//   NVIDIA Ampere GA102 GPU Architecture whitepaper, RTX 3090: 71 with fp32 accumulate (142 fp16)
constexpr std::array<std::pair<std::string_view, double>, 17> kPeakBf16Flops{{
    {"NVIDIA H100 80GB HBM3", 989.5e12},
    {"NVIDIA H100 PCIe", 756.5e12},
    {"NVIDIA H100 NVL", 835.5e12},
    {"NVIDIA H200", 989.5e12},
    {"NVIDIA H200 NVL", 835.5e12},
    {"NVIDIA GH200 480GB", 989.5e12},
    {"NVIDIA B200", 2250e12},
    {"NVIDIA A100-SXM4-80GB", 312e12},
    {"NVIDIA A100-SXM4-40GB", 312e12},
    {"NVIDIA A100 80GB PCIe", 312e12},
    {"NVIDIA A100-PCIE-40GB", 312e12},
    {"NVIDIA L40S", 362.05e12},
    {"NVIDIA L40", 181.05e12},
    {"NVIDIA L4", 121e12},
    {"NVIDIA A10", 125e12},
    {"NVIDIA GeForce RTX 4090", 165.2e12},
    {"NVIDIA GeForce RTX 3090", 71e12},
}};

}  // namespace

double peak_bf16_flops_of(std::string_view device_name) {
  for (const auto& [name, flops] : kPeakBf16Flops) {
    if (name == device_name) return flops;
  }
  return 0.0;
}

double peak_bf16_flops(const c10::Device& device) {
  if (!device.is_cuda()) return 0.0;
  return peak_bf16_flops_of(at::cuda::getDeviceProperties(device.index())->name);
}

namespace {

// The kernel's file at `path` (/proc, /sys) as a stream; empty where it cannot be read.
std::istringstream kernel_file(const std::filesystem::path& path) {
  try {
    return std::istringstream(read_text_file(path, "kernel file"));
  } catch (const std::exception&) {
    return std::istringstream();
  }
}

// The first number in `path`, if it has one ("max" in a cgroup v2 limit has none).
std::optional<int64_t> number_in(const std::filesystem::path& path) {
  std::istringstream in = kernel_file(path);
  int64_t value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

// The value of `key` in a "key value" file such as memory.stat or /proc/meminfo.
std::optional<int64_t> field_in(const std::filesystem::path& path, const std::string& key) {
  std::istringstream in = kernel_file(path);
  for (std::string name; in >> name;) {
    int64_t value = 0;
    if (name == key && in >> value) return value;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::nullopt;
}

// This process's memory cgroup directory: its path in /proc/self/cgroup under the mount, where
// that exists (a Slurm job, a systemd slice), else the mount itself (a container with its own
// cgroup namespace sees its group there).
std::filesystem::path own_cgroup(const std::filesystem::path& mount,
                                 const std::string& controller) {
  std::istringstream in = kernel_file("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2) or "4:memory:/path" (v1)
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    if (line.substr(first + 1, second - first - 1) != controller) continue;
    std::filesystem::path own = mount / line.substr(second + 1).substr(1);
    if (std::filesystem::exists(own)) return own;
  }
  return mount;
}

// The memory this process could still take without swapping: the kernel's MemAvailable (free
// memory and the page cache it can drop), or less where a cgroup limits the process: its limit
// minus what the group uses, less the file pages it could drop (the mmap'd shards among them).
// /proc/meminfo shows the whole machine even inside a cgroup.
int64_t available_host_memory() {
  int64_t available = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) *
                      static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  if (const auto kib = field_in("/proc/meminfo", "MemAvailable:")) available = *kib * 1024;
  struct CgroupFiles {
    std::filesystem::path group;
    const char* limit;
    const char* usage;
    const char* droppable;
  };
  const std::filesystem::path root = "/sys/fs/cgroup";
  for (const CgroupFiles& cgroup :
       {CgroupFiles{own_cgroup(root, ""), "memory.max", "memory.current", "inactive_file"},
        CgroupFiles{own_cgroup(root / "memory", "memory"), "memory.limit_in_bytes",
                    "memory.usage_in_bytes", "total_inactive_file"}}) {
    const auto limit = number_in(cgroup.group / cgroup.limit);
    const auto usage = number_in(cgroup.group / cgroup.usage);
    if (!limit || !usage) continue;
    const int64_t droppable = field_in(cgroup.group / "memory.stat", cgroup.droppable).value_or(0);
    available = std::min(available, std::max<int64_t>(*limit - *usage + droppable, 0));
  }
  return available;
}

}  // namespace

int64_t peak_memory_bytes(const c10::Device& device) {
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  }
  std::istringstream status = kernel_file("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;  // in kB
  }
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void reset_peak_memory(const c10::Device& device) {
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return;
  }
  // 5: the resident set's high-water mark becomes the resident set (proc(5)).
  std::ofstream("/proc/self/clear_refs") << "5";
}

int64_t memory_per_rank(const c10::Device& device, int ranks_on_node) {
  if (device.is_cuda())
    return static_cast<int64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  return available_host_memory() / std::max(ranks_on_node, 1);
}

}  // namespace mltrain
