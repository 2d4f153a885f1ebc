#pragma once

#include "model/layers/model_config.h"

namespace mltrain::testing {

// A model small enough for many forward passes in a unit test, with every feature of the real
// one: grouped-query attention (4 query heads over 2 key/value heads), several layers, tying.
inline ModelConfig tiny_config() {
  ModelConfig config;
  config.vocab_size = 97;
  config.d_model = 64;
  config.n_layers = 2;
  config.n_q_heads = 4;
  config.n_kv_heads = 2;
  config.head_dim = 16;
  config.d_ffn = 96;
  config.max_seq_len = 64;
  return config;
}

}  // namespace mltrain::testing
