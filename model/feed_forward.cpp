#include "model/feed_forward.h"

#include <ATen/ATen.h>

#include "model/cpu_kernels.h"
#include "model/kernel_choice.h"
#include "model/linear.h"

namespace mltrain {

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t d_ffn)
    : w_gate(register_module("w_gate", torch::nn::Linear(bias_free_linear(d_model, d_ffn)))),
      w_up(register_module("w_up", torch::nn::Linear(bias_free_linear(d_model, d_ffn)))),
      w_down(register_module("w_down", torch::nn::Linear(bias_free_linear(d_ffn, d_model)))) {}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return project(swiglu(project(x, w_gate->weight), project(x, w_up->weight)), w_down->weight);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (use_fused_cpu_kernel(gate) && fused_kernels_support(gate.scalar_type()) &&
      up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes()) {
    return fused_swiglu(gate, up);
  }
  return swiglu_composition(gate, up);
}

at::Tensor swiglu_composition(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

}  // namespace mltrain
