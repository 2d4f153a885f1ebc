#include "model/attention.h"

#include <ATen/ATen.h>

#include "model/kv_cache.h"
#include "model/linear.h"
#include "model/rotary.h"

namespace mltrain {

AttentionImpl::AttentionImpl(const ModelConfig& config)
    : wq(register_module("wq", torch::nn::Linear(bias_free_linear(
                                   config.d_model, config.n_q_heads * config.head_dim)))),
      wk(register_module("wk", torch::nn::Linear(bias_free_linear(
                                   config.d_model, config.n_kv_heads * config.head_dim)))),
      wv(register_module("wv", torch::nn::Linear(bias_free_linear(
                                   config.d_model, config.n_kv_heads * config.head_dim)))),
      wo(register_module("wo", torch::nn::Linear(bias_free_linear(
                                   config.n_q_heads * config.head_dim, config.d_model)))),
      n_q_heads_(config.n_q_heads),
      n_kv_heads_(config.n_kv_heads),
      head_dim_(config.head_dim) {}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  int64_t start_pos, KVCache* cache, int64_t layer) {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  // Rotary embeddings act on [B, T, H, D]; SDPA wants [B, H, T, D].
  at::Tensor q = apply_rotary(wq(x).view({batch, length, n_q_heads_, head_dim_}), cos, sin);
  at::Tensor k = apply_rotary(wk(x).view({batch, length, n_kv_heads_, head_dim_}), cos, sin);
  at::Tensor v = wv(x).view({batch, length, n_kv_heads_, head_dim_});
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  if (cache != nullptr) std::tie(k, v) = cache->append(layer, start_pos, k, v);

  // SDPA's is_causal aligns the mask top-left (query i sees keys 0..i), which is right only when
  // queries and keys start at the same position. New tokens after a cached prefix need query i to
  // see keys 0..start_pos+i: one query sees everything; several need an explicit mask.
  const int64_t n_keys = k.size(2);
  bool is_causal = false;
  std::optional<at::Tensor> mask;
  if (n_keys == length) {
    is_causal = length > 1;
  } else if (length > 1) {
    const auto positions = at::TensorOptions().dtype(at::kLong).device(x.device());
    const at::Tensor query_pos = at::arange(start_pos, start_pos + length, positions).unsqueeze(1);
    mask = at::arange(n_keys, positions).unsqueeze(0) <= query_pos;  // [T, n_keys]
  }
  const at::Tensor attended = at::scaled_dot_product_attention(
      q, k, v, mask, /*dropout_p=*/0.0, is_causal, /*scale=*/std::nullopt, /*enable_gqa=*/true);
  return wo(attended.transpose(1, 2).reshape({batch, length, n_q_heads_ * head_dim_}));
}

}  // namespace mltrain
