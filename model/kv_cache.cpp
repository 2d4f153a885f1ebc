#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include "model/model_config.h"

namespace mltrain {

KVCache::KVCache(const ModelConfig& config, int64_t batch, int64_t capacity,
                 at::TensorOptions options) {
  for (int64_t layer = 0; layer < config.n_layers; ++layer) {
    keys_.push_back(at::zeros({batch, config.n_kv_heads, capacity, config.head_dim}, options));
    values_.push_back(at::zeros({batch, config.n_kv_heads, capacity, config.head_dim}, options));
  }
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, int64_t start, const at::Tensor& k,
                                                  const at::Tensor& v) {
  const int64_t length = k.size(2);
  TORCH_CHECK(start + length <= keys_[layer].size(2), "KV cache holds ", keys_[layer].size(2),
              " positions, asked for ", start + length);
  keys_[layer].narrow(2, start, length).copy_(k);
  values_[layer].narrow(2, start, length).copy_(v);
  return {keys_[layer].narrow(2, 0, start + length), values_[layer].narrow(2, 0, start + length)};
}

}  // namespace mltrain
