#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <utility>
#include <vector>

namespace mltrain {

struct ModelConfig;

// Keys and values of every layer for incremental decoding. Each layer's buffers are allocated once
// at [batch, n_kv_heads, capacity, head_dim], the layout attention consumes, so a decoding step
// writes its new slots in place and attends over a view of the filled prefix.
//
// Prompts of different lengths share one batch left-padded: row b's tokens start at slot
// row_starts[b] and the slots before it hold padding. Such a cache gives each row its own rotary
// positions (counted from 0 at its first token) and an attention mask that hides the padding, so
// that a row computes what it would alone. (RoPE scores depend only on position differences, but
// positions shifted by the padding would round differently and could run past the model's
// max_seq_len rows of tables.) Without padding, slots are positions and attention needs no mask
// beyond causality: the layers take their plain path.
class KVCache {
 public:
  // Rows without padding.
  KVCache(const ModelConfig& config, int64_t batch, int64_t capacity, at::TensorOptions options);
  // Left-padded rows, row b's tokens starting at slot row_starts[b].
  KVCache(const ModelConfig& config, std::vector<int64_t> row_starts, int64_t capacity,
          at::TensorOptions options);

  // Stores k, v [B, n_kv_heads, T, head_dim] of `layer` at slots [start, start + T) and
  // returns views of slots [0, start + T).
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, int64_t start, const at::Tensor& k,
                                           const at::Tensor& v);

  // Keeps the rows `rows` (indices into the current batch, in their new order) and drops the
  // others, so that finished sequences stop costing compute.
  void keep_rows(const std::vector<int64_t>& rows);

  bool padded() const { return padded_; }

  // For a padded cache: the rotary position of each row's token at slots [start, start + length),
  // [B, length] int64 on the cache's device; padding slots get position 0.
  at::Tensor positions(int64_t start, int64_t length) const;
  // The largest position positions(start, length) gives a real token.
  int64_t last_position(int64_t start, int64_t length) const;
  // For a padded cache: [B, 1, length, start + length] bool, true where the query at slot
  // start + i may attend to key slot j: a real token sees the row's tokens up to itself; a padding
  // query sees only itself, so that its unused output stays finite rather than NaN.
  at::Tensor attention_mask(int64_t start, int64_t length) const;

 private:
  void set_row_starts(std::vector<int64_t> row_starts);

  at::Device device_;
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
  std::vector<int64_t> row_starts_;
  at::Tensor row_starts_tensor_;  // [B, 1] on the cache's device
  bool padded_ = false;
};

}  // namespace mltrain
