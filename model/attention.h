#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "model/model_config.h"

namespace mltrain {

class KVCache;

// Grouped-query causal self-attention: n_q_heads query heads share n_kv_heads key/value heads.
// SDPA receives the un-repeated keys and values (enable_gqa), so the repeated K/V of a naive
// implementation are never built.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);

  // x [B, T, d_model] holds tokens at positions [start_pos, start_pos + T); cos/sin are the rotary
  // tables of those positions. With a cache, this layer's keys and values are appended to it
  // and attention covers every cached position before them too.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t start_pos = 0, KVCache* cache = nullptr, int64_t layer = 0);

  torch::nn::Linear wq;
  torch::nn::Linear wk;
  torch::nn::Linear wv;
  torch::nn::Linear wo;

 private:
  int64_t n_q_heads_;
  int64_t n_kv_heads_;
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

}  // namespace mltrain
