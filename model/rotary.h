#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/kernels.h"

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

// Rotates x [B, T, H, head_dim] by tables [T, head_dim], or [B, T, head_dim] for positions per row:
// with Kernels::fused_cpu, fused_rotary (model/cpu_kernels.h) where the device and the dtypes allow
// it; apply_rotary otherwise.
at::Tensor rotate_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        Kernels kernels);

// The same as plain ATen operators (tables cast to x's dtype): the reference of the fused kernel.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace mltrain
