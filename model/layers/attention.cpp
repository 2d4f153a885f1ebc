#include "model/layers/attention.h"

#include <ATen/ATen.h>

#include <vector>

#include "model/layers/document_attention.h"
#include "model/layers/kv_cache.h"
#include "model/layers/linear.h"
#include "model/layers/rotary.h"

namespace mltrain {

bool sdpa_needs_repeated_kv(c10::DeviceType device, c10::ScalarType query_dtype, int64_t n_q_heads,
                            int64_t n_kv_heads) {
  const bool half_precision = query_dtype == at::kHalf || query_dtype == at::kBFloat16;
  return device == c10::kCUDA && !half_precision && n_q_heads != n_kv_heads;
}

at::Tensor grouped_query_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, bool is_causal,
                              bool repeat_kv) {
  if (repeat_kv) {
    const int64_t group = q.size(1) / k.size(1);
    return at::scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask, /*dropout_p=*/0.0,
        is_causal, /*scale=*/std::nullopt, /*enable_gqa=*/false);
  }
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, is_causal,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/true);
}

AttentionImpl::AttentionImpl(const ModelConfig& config, Kernels kernels,
                             const WeightOptions& options, const LoraConfig& lora)
    : wqkv(register_module("wqkv",
                           Matrix((config.n_q_heads + 2 * config.n_kv_heads) * config.head_dim,
                                  config.d_model, options))),
      wo(register_module("wo",
                         Matrix(config.d_model, config.n_q_heads * config.head_dim, options))),
      n_q_heads_(config.n_q_heads),
      n_kv_heads_(config.n_kv_heads),
      head_dim_(config.head_dim),
      kernels_(kernels) {
  const int64_t q_rows = config.n_q_heads * config.head_dim;
  const int64_t kv_rows = config.n_kv_heads * config.head_dim;
  wqkv_lora =
      adapter_for(config.d_model, {{"q", q_rows}, {"k", kv_rows}, {"v", kv_rows}}, lora, options);
  if (wqkv_lora) register_module("wqkv_lora", wqkv_lora);
  wo_lora = adapter_for(q_rows, {{"o", config.d_model}}, lora, options);
  if (wo_lora) register_module("wo_lora", wo_lora);
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  int64_t start_pos, KVCache* cache, int64_t layer,
                                  const DocumentAttention* documents) {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  // [B, T, heads, D]: the query heads, then the key heads, then the value heads. Rotary embeddings
  // act on [B, T, H, D]; SDPA wants [B, H, T, D]. The rotated copy is a new tensor, so the
  // product's output is freed once it is made.
  const at::Tensor heads =
      rotate_heads(adapted(wqkv_lora, x, project(x, wqkv->weight, kernels_))
                       .view({batch, length, n_q_heads_ + 2 * n_kv_heads_, head_dim_}),
                   cos, sin, kernels_, /*rotated_heads=*/n_q_heads_ + n_kv_heads_);
  // Split, not narrowed: backward joins the three gradients in one copy, where each narrow's
  // backward would fill a zero tensor of the whole and autograd then add the three.
  const std::vector<at::Tensor> qkv =
      heads.split_with_sizes({n_q_heads_, n_kv_heads_, n_kv_heads_}, 2);
  const at::Tensor q = qkv[0].transpose(1, 2);
  at::Tensor k = qkv[1].transpose(1, 2);
  at::Tensor v = qkv[2].transpose(1, 2);
  if (documents != nullptr) {
    TORCH_CHECK(cache == nullptr, "attention within documents takes no cache");
    return attended_output((*documents)(q, k, v));
  }
  if (cache != nullptr) std::tie(k, v) = cache->append(layer, start_pos, k, v);

  // SDPA's is_causal aligns the mask top-left (query i sees keys 0..i), which is right only when
  // queries and keys start at the same position. New tokens after a cached prefix need query i to
  // see keys 0..start_pos+i: one query sees everything; several need an explicit mask.
  const int64_t n_keys = k.size(2);
  bool is_causal = false;
  std::optional<at::Tensor> mask;
  if (cache != nullptr && cache->padded()) {
    mask = cache->attention_mask(start_pos, length);  // [B, 1, T, n_keys], hiding the padding
  } else if (n_keys == length) {
    is_causal = length > 1;
  } else if (length > 1) {
    const auto positions = at::TensorOptions().dtype(at::kLong).device(x.device());
    const at::Tensor query_pos = at::arange(start_pos, start_pos + length, positions).unsqueeze(1);
    mask = at::arange(n_keys, positions).unsqueeze(0) <= query_pos;  // [T, n_keys]
  }
  // Under autocast the projections already return the autocast dtype, so q's dtype is the one
  // SDPA computes in.
  const bool repeat_kv =
      sdpa_needs_repeated_kv(q.device().type(), q.scalar_type(), n_q_heads_, n_kv_heads_);
  return attended_output(grouped_query_sdpa(q, k, v, mask, is_causal, repeat_kv));
}

at::Tensor AttentionImpl::attended_output(const at::Tensor& attended) {
  // [B, H, T, D] -> [B, T, H x D], the heads side by side as wo reads them.
  const at::Tensor heads = attended.transpose(1, 2).flatten(2);
  return adapted(wo_lora, heads, project(heads, wo->weight, kernels_));
}

}  // namespace mltrain
