#pragma once

#include <c10/macros/Macros.h>

#include <cmath>

namespace mltrain::glue {

// glue_math.h's device-dependent parts for one float per thread: the CUDA kernels, and the CPU
// tests of what they compute. Apart from glue_math.h, as cpu_kernels.cpp must not include it
// (see there).
struct ScalarMath {
  static C10_HOST_DEVICE float exp(float x) { return ::expf(x); }
  static C10_HOST_DEVICE float sqrt(float x) { return ::sqrtf(x); }
  static C10_HOST_DEVICE float log(float x) { return ::logf(x); }
  template <typename T>
  static C10_HOST_DEVICE float round(float x) {
    return static_cast<float>(static_cast<T>(x));
  }
};

}  // namespace mltrain::glue
