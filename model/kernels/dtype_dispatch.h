#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <type_traits>

// From a tensor's dtype to the C++ type a fused kernel is instantiated for, on the CPU
// (cpu_kernels.cpp) and on CUDA (cuda_launch.cu): the kernels take fp32 and bf16 activations.
namespace mltrain {

// Calls f with a value of the C++ type of dtype: float or c10::BFloat16.
template <typename F>
void for_activation_dtype(at::ScalarType dtype, const F& f) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "mltrain's fused kernels take Float or BFloat16, not ", dtype);
  if (dtype == at::kFloat) {
    f(float{});
  } else {
    f(c10::BFloat16{});
  }
}

// Calls f with a value of the C++ type of delta's dtype, delta being added to a residual of C++
// type T: fp32 or bf16 beside an fp32 residual, only bf16 beside a bf16 one (the sum keeps the
// residual's dtype), and T where there is no delta (undefined).
template <typename T, typename F>
void for_delta_dtype(const at::Tensor& delta, const F& f) {
  if constexpr (std::is_same_v<T, float>) {
    for_activation_dtype(delta.defined() ? delta.scalar_type() : at::kFloat, f);
  } else {
    f(T{});
  }
}

}  // namespace mltrain
