#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

// The launches of mltrain's CUDA glue kernels (cuda_launch.cu), on the current stream: tensors in,
// tensors out, no autograd. cuda_kernels.cpp checks the arguments and wraps them as autograd
// functions; only it calls these. Every tensor is contiguous on one CUDA device, the activations
// fp32 or bf16 (T below), the weights, tables and statistics fp32. The arithmetic is
// glue_math.h's.
//
// A build against a CPU-only LibTorch compiles cuda_launch_absent.cpp instead, whose launches
// throw: cuda_kernels_built() says which.
namespace mltrain::cuda_launch {

bool built();

// x [rows, dim] T, weight [dim] -> out [rows, dim] (fp32 or x's dtype: out's own), rstd [rows].
// With delta [rows, dim] (fp32 or bf16; undefined for none), sum [rows, dim] T gets x + delta,
// and that is normalised.
void rms_norm_forward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                      double eps, const at::Tensor& sum, const at::Tensor& out,
                      const at::Tensor& rstd);

// grad [rows, dim] (fp32 or x's dtype), x [rows, dim] T, weight [dim], rstd [rows]
// -> grad_x [rows, dim] T, plus grad_residual [rows, dim] T where it is defined, and grad_weight
// [dim], through partial sums of fixed blocks of rows added in block order: the same result every
// run.
void rms_norm_backward(const at::Tensor& grad, const at::Tensor& grad_residual, const at::Tensor& x,
                       const at::Tensor& weight, const at::Tensor& rstd, const at::Tensor& grad_x,
                       const at::Tensor& grad_weight);

// x [B, T, H, D] T, tables cos and sin [T, D] or [B, T, D] -> out [B, T, H, D] T: heads
// [0, rotated_heads) rotated (by the negative angle if inverse), the rest copied.
void rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
            int64_t rotated_heads, bool inverse, const at::Tensor& out);

// gate_up [rows, 2 width] T -> out [rows, width] T.
void swiglu_forward(const at::Tensor& gate_up, const at::Tensor& out);

// grad [rows, width] T, gate_up [rows, 2 width] T -> grad_gate_up [rows, 2 width] T.
void swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_up,
                     const at::Tensor& grad_gate_up);

// logits [rows, vocab] T (vocab > 0), targets [rows] int64 -> loss [rows], and each row's max
// and log(sum(exp(logit - max))), fp32.
void cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets,
                           const at::Tensor& loss, const at::Tensor& row_max,
                           const at::Tensor& row_log_sum);

// The gradient of the mean loss, grad_loss [] fp32 on the device (read there, no host sync), into
// grad_logits [rows, vocab] T.
void cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& logits,
                            const at::Tensor& targets, const at::Tensor& row_max,
                            const at::Tensor& row_log_sum, const at::Tensor& grad_logits);

}  // namespace mltrain::cuda_launch
