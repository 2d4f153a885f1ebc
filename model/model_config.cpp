#include "model/model_config.h"

#include <fmt/format.h>

#include "common/error.h"

namespace mltrain {
namespace {

void require_positive(int64_t value, const char* key) {
  if (value < 1) throw UserError(fmt::format("model.{} must be at least 1, got {}", key, value));
}

}  // namespace

void ModelConfig::validate() const {
  require_positive(vocab_size, "vocab_size");
  require_positive(d_model, "d_model");
  require_positive(n_layers, "n_layers");
  require_positive(n_q_heads, "n_q_heads");
  require_positive(n_kv_heads, "n_kv_heads");
  require_positive(head_dim, "head_dim");
  require_positive(d_ffn, "d_ffn");
  require_positive(max_seq_len, "max_seq_len");
  if (n_q_heads % n_kv_heads != 0) {
    throw UserError(fmt::format(
        "model.n_q_heads ({}) must be a multiple of model.n_kv_heads ({}): each key/value head "
        "serves a whole group of query heads",
        n_q_heads, n_kv_heads));
  }
  if (head_dim % 2 != 0) {
    throw UserError(fmt::format(
        "model.head_dim ({}) must be even: rotary embeddings rotate pairs of dimensions",
        head_dim));
  }
  if (!(rope_theta > 1.0)) {
    throw UserError(fmt::format("model.rope_theta must be greater than 1, got {}", rope_theta));
  }
  if (!(norm_eps > 0.0)) {
    throw UserError(fmt::format("model.norm_eps must be positive, got {}", norm_eps));
  }
  if (!(init_std > 0.0)) {
    throw UserError(fmt::format("model.init_std must be positive, got {}", init_std));
  }
}

int64_t ModelConfig::block_parameters() const {
  const int64_t q = n_q_heads * head_dim;
  const int64_t kv = n_kv_heads * head_dim;
  return 2 * d_model + d_model * q + 2 * d_model * kv + q * d_model + 3 * d_model * d_ffn;
}

int64_t ModelConfig::parameters() const {
  const int64_t embeddings = vocab_size * d_model * (tie_word_embeddings ? 1 : 2);
  return embeddings + n_layers * block_parameters() + d_model;  // and the final norm
}

}  // namespace mltrain
