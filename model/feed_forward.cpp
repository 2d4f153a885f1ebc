#include "model/feed_forward.h"

#include <ATen/ATen.h>

#include "model/cpu_kernels.h"
#include "model/linear.h"

namespace mltrain {

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t d_ffn, Kernels kernels)
    : w_gate(register_module("w_gate", torch::nn::Linear(bias_free_linear(d_model, d_ffn)))),
      w_up(register_module("w_up", torch::nn::Linear(bias_free_linear(d_model, d_ffn)))),
      w_down(register_module("w_down", torch::nn::Linear(bias_free_linear(d_ffn, d_model)))),
      kernels_(kernels) {}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  const at::Tensor gate = project(x, w_gate->weight, kernels_);
  const at::Tensor up = project(x, w_up->weight, kernels_);
  return project(swiglu(gate, up, kernels_), w_down->weight, kernels_);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, Kernels kernels) {
  if (runs_fused_cpu(kernels, gate) && up.scalar_type() == gate.scalar_type() &&
      up.sizes() == gate.sizes()) {
    return fused_swiglu(gate, up);
  }
  return swiglu_composition(gate, up);
}

at::Tensor swiglu_composition(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

}  // namespace mltrain
