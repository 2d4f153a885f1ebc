#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace mltrain {

// Fused CPU kernels for the memory-bound glue between the matmuls: each reads its inputs once and
// writes its outputs once, forward and backward, where the ATen composition makes a pass (and a
// temporary) per operator. Each is an autograd function equal, up to rounding, to the composition
// it replaces; tests/model/cpu_kernels_test.cpp holds them to that. They take CPU tensors of fp32
// or bf16, compute in fp32 and round once on output; anything else is a TORCH_CHECK error, so the
// callers ask fused_kernels_support first and fall back to the composition.
//
// Results do not depend on the number of threads: elementwise work is split freely, and the one
// reduction across rows (RMSNorm's weight gradient) sums fixed blocks of rows in block order.
// Without a gradient to compute (GradMode off, or no input requiring one) nothing is saved.

// Whether the fused kernels take tensors of this dtype here: fp32 and bf16, on a CPU where ATen
// runs its own AVX2 or AVX-512 kernels (the fused ones are AVX2 code on x86-64; elsewhere they are
// at::vec's default code). ATEN_CPU_CAPABILITY=default turns them off with ATen's.
bool fused_kernels_support(at::ScalarType dtype);

// rms_norm_composition (model/layers/rms_norm.h): x [.., dim] fp32 or bf16, weight [dim] fp32. The
// statistic is fp32, the normalised value is rounded to x's dtype before the scale, and the
// result is fp32 (x's dtype promoted with the weight's), or under the CPU's bf16 autocast bf16:
// exactly what the projection that takes it would cast the fp32 result to, without the fp32
// tensor. Backward keeps x and one fp32 rstd a row, and takes the gradient in either dtype.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x + delta and fused_rms_norm of it, in one pass over the rows: the residual add folded into the
// norm that follows it. x is the residual stream, fp32 or bf16; delta (of x's shape) is fp32 or
// bf16 where x is fp32, bf16 where x is; the sum keeps x's dtype. Backward adds the sum's gradient
// from its other use to the norm's in the same pass.
std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps);

// rotate_leading_heads (model/layers/rotary.h), rotate-half: x [B, T, H, D] fp32 or bf16, tables
// [T, D] (shared by the rows) or [B, T, D] (each row's own positions) fp32 taking no gradient.
// Heads [0, rotated_heads) are rotated (all of them by default) and the others copied: queries and
// keys rotated, and values copied, in one pass over the fused projection's output. Out of place,
// contiguous, x's dtype; backward rotates the gradient back.
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        std::optional<int64_t> rotated_heads = std::nullopt);

// swiglu_composition (model/layers/feed_forward.h): silu(gate) * up of gate_up [.., 2 width] (fp32
// or bf16), which holds gate and then up in its last dimension, into [.., width]; backward keeps
// the input and writes the gradient of gate_up whole.
at::Tensor fused_swiglu(const at::Tensor& gate_up);

}  // namespace mltrain
