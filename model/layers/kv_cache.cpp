#include "model/layers/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "model/layers/model_config.h"

namespace mltrain {

KVCache::KVCache(const ModelConfig& config, int64_t batch, int64_t capacity,
                 at::TensorOptions options)
    : KVCache(config, std::vector<int64_t>(batch, 0), capacity, options) {}

KVCache::KVCache(const ModelConfig& config, std::vector<int64_t> row_starts, int64_t capacity,
                 at::TensorOptions options)
    : device_(options.device()) {
  const auto batch = static_cast<int64_t>(row_starts.size());
  for (int64_t layer = 0; layer < config.n_layers; ++layer) {
    keys_.push_back(at::zeros({batch, config.n_kv_heads, capacity, config.head_dim}, options));
    values_.push_back(at::zeros({batch, config.n_kv_heads, capacity, config.head_dim}, options));
  }
  set_row_starts(std::move(row_starts));
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

void KVCache::keep_rows(const std::vector<int64_t>& rows) {
  const at::Tensor index = at::tensor(rows, at::kLong).to(device_);
  for (at::Tensor& keys : keys_) keys = keys.index_select(0, index);
  for (at::Tensor& values : values_) values = values.index_select(0, index);
  std::vector<int64_t> starts;
  for (const int64_t row : rows) starts.push_back(row_starts_.at(row));
  set_row_starts(std::move(starts));
}

void KVCache::set_row_starts(std::vector<int64_t> row_starts) {
  row_starts_ = std::move(row_starts);
  row_starts_tensor_ = at::tensor(row_starts_, at::kLong).to(device_).unsqueeze(1);
  padded_ = std::any_of(row_starts_.begin(), row_starts_.end(), [](int64_t s) { return s > 0; });
}

at::Tensor KVCache::positions(int64_t start, int64_t length) const {
  const at::Tensor slots =
      at::arange(start, start + length, row_starts_tensor_.options()).unsqueeze(0);  // [1, T]
  return (slots - row_starts_tensor_).clamp_min(0);
}

int64_t KVCache::last_position(int64_t start, int64_t length) const {
  return start + length - 1 - *std::min_element(row_starts_.begin(), row_starts_.end());
}

at::Tensor KVCache::attention_mask(int64_t start, int64_t length) const {
  const auto batch = static_cast<int64_t>(row_starts_.size());
  const at::TensorOptions options = row_starts_tensor_.options();
  const at::Tensor queries = at::arange(start, start + length, options).view({1, length, 1});
  const at::Tensor keys = at::arange(start + length, options).view({1, 1, start + length});
  const at::Tensor row_start = row_starts_tensor_.view({batch, 1, 1});
  const at::Tensor sees = (keys <= queries) & (keys >= row_start);
  return (sees | (keys == queries)).unsqueeze(1);
}

}  // namespace mltrain
