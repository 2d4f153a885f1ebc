#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace mltrain {

// Fused CUDA kernels for the glue between the matmuls, the GPU's counterpart of cpu_kernels.h:
// each reads its inputs once and writes its outputs once, forward and backward, where the ATen
// composition makes a pass (and a temporary) per operator. Each is an autograd function equal, up
// to rounding, to the composition it replaces, and computes with glue_math.h's arithmetic, which
// tests/model/glue_math_test.cpp checks on the CPU; tests/gpu/cuda_kernels_test.cpp holds the
// kernels themselves to the compositions on a GPU. They take CUDA tensors of fp32 or bf16, in any
// layout (they copy what is not contiguous), compute in fp32 and round once on output; anything
// else is a TORCH_CHECK error, so the layers ask runs_fused (model/kernels/kernels.h) first.

// Whether this build has them: it does against a CUDA LibTorch, which compiles them with nvcc.
bool cuda_kernels_built();

// rms_norm_composition (model/layers/rms_norm.h) on CUDA: x [.., dim] fp32 or bf16, weight [dim]
// fp32. The result is fp32, as the composition's, or bf16 under bf16 autocast: exactly what the
// projection that takes it would cast it to, without the fp32 round trip.
at::Tensor cuda_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x + delta and cuda_rms_norm of it, in one kernel, as fused_add_rms_norm
// (model/kernels/cpu_kernels.h): the sum keeps x's dtype, and backward adds the sum's gradient from
// its other use to the norm's.
std::pair<at::Tensor, at::Tensor> cuda_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                    const at::Tensor& weight, double eps);

// rotate_leading_heads (model/layers/rotary.h) on CUDA: x [B, T, H, D], tables [T, D] or [B, T, D]
// fp32; heads [0, rotated_heads) rotated, the others copied, into a new contiguous tensor.
at::Tensor cuda_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t rotated_heads);

// swiglu_composition (model/layers/feed_forward.h) on CUDA: gate_up [.., 2 width] -> [.., width].
at::Tensor cuda_swiglu(const at::Tensor& gate_up);

// The mean cross-entropy of logits [N, V] (fp32 or bf16, as the output projection gives them)
// against targets [N] (int64 in [0, V): every row counts, there is no ignored index, and a target
// out of range is a device-side assert, as in ATen's loss), a 0-dim fp32 tensor:
// at::cross_entropy_loss of the logits in fp32, in one pass over the logits that keeps each row's
// log-sum-exp, and a backward pass that writes the logits' gradient in their dtype. No fp32 copy of
// the logits is made. With gradient_overwrites_logits, backward writes the gradient over the
// logits, for a caller that has no other use for them (the model's loss): the step's largest
// activation is not held twice. Their version is bumped, so that a second backward through them is
// refused, not misled; logits that are a leaf, or a view of one, are refused.
at::Tensor cuda_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                              bool gradient_overwrites_logits = false);

}  // namespace mltrain
