#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "model/kernels.h"

namespace mltrain {

// SwiGLU: w_down(silu(w_gate x) * w_up x).
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t d_model, int64_t d_ffn, Kernels kernels);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear w_gate;
  torch::nn::Linear w_up;
  torch::nn::Linear w_down;

 private:
  Kernels kernels_;
};
TORCH_MODULE(FeedForward);

// silu(gate) * up: with Kernels::fused_cpu, fused_swiglu (model/cpu_kernels.h) where the device and
// the dtypes allow it; swiglu_composition otherwise.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, Kernels kernels);

// The same as plain ATen operators: the reference of the fused kernel.
at::Tensor swiglu_composition(const at::Tensor& gate, const at::Tensor& up);

}  // namespace mltrain
