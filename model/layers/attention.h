#pragma once

#include <ATen/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <optional>

#include "model/kernels/kernels.h"
#include "model/layers/linear.h"
#include "model/layers/lora.h"
#include "model/layers/model_config.h"

namespace mltrain {

class DocumentAttention;
class KVCache;

// Whether SDPA should receive keys and values repeated to the query heads rather than grouped
// ones (enable_gqa). On CUDA, the flash and cuDNN kernels take grouped heads but only fp16/bf16,
// and the memory-efficient kernel takes fp32 but refuses grouped heads; so fp32 with grouped heads
// would fall to the math kernel, which builds the [B, H, T, T] scores. Repeated K/V cost
// n_q_heads / n_kv_heads times their memory, far less than the scores. Everywhere else (the CPU,
// fp16/bf16 on CUDA) a fused kernel takes the grouped heads.
bool sdpa_needs_repeated_kv(c10::DeviceType device, c10::ScalarType query_dtype, int64_t n_q_heads,
                            int64_t n_kv_heads);

// SDPA of queries [B, n_q_heads, T, D] over keys and values [B, n_kv_heads, S, D], n_kv_heads
// dividing n_q_heads: with grouped heads (enable_gqa), or with K/V repeated to the query heads
// when repeat_kv. Either way each query head attends to the key/value head of its group.
at::Tensor grouped_query_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, bool is_causal,
                              bool repeat_kv);

// Grouped-query causal self-attention: n_q_heads query heads share n_kv_heads key/value heads.
// Queries, keys and values come out of one product, wqkv, which holds the query projection's
// rows, then the key projection's, then the value projection's (Hugging Face's q_proj, k_proj and
// v_proj, model/interop/hf_state_dict.h); one pass rotates the queries and keys and copies the
// values out of it. SDPA receives the un-repeated keys and values (enable_gqa) wherever a fused
// kernel takes them, so the repeated K/V of a naive implementation are built only where that saves
// the scores.
class AttentionImpl : public torch::nn::Module {
 public:
  // The projections on `options`' device (model_config.h's shapes), drawn by the model, with
  // `lora`'s adapters on those of q, k, v and o it targets.
  AttentionImpl(const ModelConfig& config, Kernels kernels, const WeightOptions& options = {},
                const LoraConfig& lora = {});

  // x [B, T, d_model] holds tokens at positions [start_pos, start_pos + T); cos/sin are the rotary
  // tables of those positions. With a cache, this layer's keys and values are appended to it
  // and attention covers every cached position before them too. With a padded cache
  // (kv_cache.h), start_pos counts slots, cos/sin [B, T, head_dim] hold each row's own positions,
  // and the cache's mask keeps the padding out of attention. With `documents` (and no cache), x
  // holds packed documents, cos/sin [B, T, head_dim] their positions, and attention stays within
  // each document.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t start_pos = 0, KVCache* cache = nullptr, int64_t layer = 0,
                     const DocumentAttention* documents = nullptr);

  Matrix wqkv;
  Matrix wo;
  LowRankAdapter wqkv_lora{nullptr};  // none without LoRA on q, k or v
  LowRankAdapter wo_lora{nullptr};

 private:
  // The output projection of the attended values [B, n_q_heads, T, head_dim].
  at::Tensor attended_output(const at::Tensor& attended);

  int64_t n_q_heads_;
  int64_t n_kv_heads_;
  int64_t head_dim_;
  Kernels kernels_;
};
TORCH_MODULE(Attention);

}  // namespace mltrain
