#pragma once

#include <c10/core/Device.h>

#include <string>

namespace mltrain {

// The device for train.device: "auto" is the first CUDA device when one is visible, else the CPU;
// "cuda" without a visible device is a UserError.
c10::Device resolve_device(const std::string& setting);

// "CPU (2 threads)" or "CUDA 0: NVIDIA H200", for the run header.
std::string describe_device(const c10::Device& device);

}  // namespace mltrain
