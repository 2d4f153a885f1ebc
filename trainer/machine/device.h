#pragma once

#include <c10/core/Device.h>

#include <string>
#include <string_view>

#include "dist/world.h"

namespace mltrain {

// The device for train.device: "auto" is the first CUDA device when one is visible, else the CPU;
// "cuda" without a visible device is a UserError that says why that may be and how to use the CPU.
c10::Device resolve_device(const std::string& setting);

// The device of this rank for train.device: on GPUs, cuda:local_rank, one GPU per rank on a node;
// more ranks on a node than visible GPUs is a UserError.
c10::Device rank_device(const std::string& setting, const World& world);

// "CPU (2 threads)" or "CUDA 0: NVIDIA H200", for the run header.
std::string describe_device(const c10::Device& device);

// Dense bf16 tensor-core peak in FLOP/s of the GPU whose name is exactly `device_name`, as CUDA
// reports it ("NVIDIA H100 80GB HBM3"); 0 for a name the table does not know, where MFU is not
// shown. Exact, because parts differ by a suffix ("NVIDIA L4" and "NVIDIA L40", "NVIDIA H100
// NVL") and a MIG slice ("... MIG 1g.18gb") has only part of the peak.
double peak_bf16_flops_of(std::string_view device_name);

// peak_bf16_flops_of the device's name; 0 for the CPU.
double peak_bf16_flops(const c10::Device& device);

// Peak memory since the process began or since reset_peak_memory: the CUDA caching allocator's
// peak on a GPU, the process's peak resident set on the CPU (VmHWM, or getrusage's where /proc
// does not say), in bytes.
int64_t peak_memory_bytes(const c10::Device& device);

// Starts the peak again from what is held now, so that it measures what comes after (training,
// not the set-up before it). On the CPU through /proc/self/clear_refs; where that cannot be
// written, the peak keeps counting from the start.
void reset_peak_memory(const c10::Device& device);

// The memory one rank may plan with: a GPU's own memory, or the memory the machine has available
// (MemAvailable, or less under a cgroup's limit) shared by the ranks on this node.
int64_t memory_per_rank(const c10::Device& device, int ranks_on_node);

}  // namespace mltrain
