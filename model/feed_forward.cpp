#include "model/feed_forward.h"

#include <ATen/ATen.h>

#include "model/linear.h"

namespace mltrain {

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t d_ffn)
    : w_gate(register_module("w_gate", torch::nn::Linear(bias_free_linear(d_model, d_ffn)))),
      w_up(register_module("w_up", torch::nn::Linear(bias_free_linear(d_model, d_ffn)))),
      w_down(register_module("w_down", torch::nn::Linear(bias_free_linear(d_ffn, d_model)))) {}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return w_down(at::silu(w_gate(x)) * w_up(x));
}

}  // namespace mltrain
