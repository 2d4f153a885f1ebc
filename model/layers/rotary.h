#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/kernels/kernels.h"

namespace mltrain {

// Rotary position embedding, rotate-half convention (Hugging Face LLaMA): dimension i is paired
// with i + head_dim/2 and the pair is rotated by position * theta^(-2i/head_dim).
// The cos/sin tables [max_seq_len, head_dim] are computed once. They are buffers so that .to()
// moves them with the model, and non-persistent in spirit: state dicts hold parameters only.
class RotaryImpl : public torch::nn::Module {
 public:
  RotaryImpl(int64_t head_dim, int64_t max_seq_len, double theta);

  // Rows [start, start + length) of the tables, for tokens at those absolute positions.
  at::Tensor cos(int64_t start, int64_t length) const { return cos_.narrow(0, start, length); }
  at::Tensor sin(int64_t start, int64_t length) const { return sin_.narrow(0, start, length); }
  // Rows at positions [B, T] (int64): [B, T, head_dim], for a batch whose rows each count their
  // own positions.
  at::Tensor cos_at(const at::Tensor& positions) const { return rows_at(cos_, positions); }
  at::Tensor sin_at(const at::Tensor& positions) const { return rows_at(sin_, positions); }

 private:
  static at::Tensor rows_at(const at::Tensor& table, const at::Tensor& positions);

  at::Tensor cos_;
  at::Tensor sin_;
};
TORCH_MODULE(Rotary);

// Rotates heads [0, rotated_heads) of x [B, T, H, head_dim] by tables [T, head_dim], or
// [B, T, head_dim] for positions per row, and copies the others as they are, into a new tensor:
// with Kernels::fused_cpu, fused_rotary (model/kernels/cpu_kernels.h), with Kernels::fused_cuda,
// cuda_rotary (model/kernels/cuda_kernels.h), where the device and the dtypes allow it, in one
// pass; rotate_leading_heads otherwise. The attention rotates its queries and keys, and copies its
// values, out of the output of its one fused projection.
at::Tensor rotate_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        Kernels kernels, int64_t rotated_heads);

// The same as plain ATen operators: the reference of the fused kernel.
at::Tensor rotate_leading_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                int64_t rotated_heads);

// Every head of x rotated (tables cast to x's dtype), as plain ATen operators.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace mltrain
