#include "model/layers/rotary.h"

#include <ATen/ATen.h>

#include <vector>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/cuda_kernels.h"

namespace mltrain {

RotaryImpl::RotaryImpl(int64_t head_dim, int64_t max_seq_len, double theta) {
  // Angles in float64 so that rows at large positions are as exact as rows near zero.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor exponents = at::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, -exponents);                       // [head_dim/2]
  const at::Tensor angles = at::outer(at::arange(max_seq_len, f64), inv_freq);  // [T, head_dim/2]
  const at::Tensor both_halves = at::cat({angles, angles}, -1);                 // [T, head_dim]
  cos_ = register_buffer("cos", both_halves.cos().to(at::kFloat));
  sin_ = register_buffer("sin", both_halves.sin().to(at::kFloat));
}

at::Tensor RotaryImpl::rows_at(const at::Tensor& table, const at::Tensor& positions) {
  return table.index_select(0, positions.flatten())
      .view({positions.size(0), positions.size(1), -1});
}

at::Tensor rotate_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        Kernels kernels, int64_t rotated_heads) {
  if (cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat) {
    if (runs_fused_cpu(kernels, x)) return fused_rotary(x, cos, sin, rotated_heads);
    if (runs_fused_cuda(kernels, x)) return cuda_rotary(x, cos, sin, rotated_heads);
  }
  return rotate_leading_heads(x, cos, sin, rotated_heads);
}

at::Tensor rotate_leading_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                int64_t rotated_heads) {
  const int64_t heads = x.size(2);
  if (rotated_heads == heads) return apply_rotary(x, cos, sin);
  // Split, so that backward joins the two gradients in one copy (see attention.cpp).
  const std::vector<at::Tensor> parts =
      x.split_with_sizes({rotated_heads, heads - rotated_heads}, 2);
  return at::cat({apply_rotary(parts[0], cos, sin), parts[1]}, 2);
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated_half = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  // [T, D] -> [T, 1, D], or [B, T, D] -> [B, T, 1, D]: broadcast over the heads of [B, T, H, D].
  const at::Tensor c = cos.to(x.scalar_type()).unsqueeze(-2);
  const at::Tensor s = sin.to(x.scalar_type()).unsqueeze(-2);
  return x * c + rotated_half * s;
}

}  // namespace mltrain
