#pragma once

#include <ATen/Tensor.h>

#include <utility>
#include <vector>

namespace mltrain {

struct ModelConfig;

// Keys and values of every layer for incremental decoding. Each layer's buffers are allocated once
// at [batch, n_kv_heads, capacity, head_dim], the layout attention consumes, so a decoding step
// writes its new positions in place and attends over a view of the filled prefix.
class KVCache {
 public:
  KVCache(const ModelConfig& config, int64_t batch, int64_t capacity, at::TensorOptions options);

  // Stores k, v [B, n_kv_heads, T, head_dim] of `layer` at positions [start, start + T) and
  // returns views of positions [0, start + T).
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, int64_t start, const at::Tensor& k,
                                           const at::Tensor& v);

 private:
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
};

}  // namespace mltrain
