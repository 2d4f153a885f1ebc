#pragma once

#include <c10/core/Device.h>

#include <string>

#include "dist/world.h"

namespace mltrain {

// The device for train.device: "auto" is the first CUDA device when one is visible, else the CPU;
// "cuda" without a visible device is a UserError.
c10::Device resolve_device(const std::string& setting);

// The device of this rank for train.device: on GPUs, cuda:local_rank, one GPU per rank on a node;
// more ranks on a node than visible GPUs is a UserError.
c10::Device rank_device(const std::string& setting, const World& world);

// "CPU (2 threads)" or "CUDA 0: NVIDIA H200", for the run header.
std::string describe_device(const c10::Device& device);

// Dense bf16 tensor-core peak of the GPU in FLOP/s, by its name (datasheet values, without
// sparsity); 0 for the CPU or a GPU the table does not know, where MFU is not shown.
double peak_bf16_flops(const c10::Device& device);

// Peak memory so far: the CUDA caching allocator's peak on a GPU, the process's peak resident set
// on the CPU, in bytes.
int64_t peak_memory_bytes(const c10::Device& device);

}  // namespace mltrain
