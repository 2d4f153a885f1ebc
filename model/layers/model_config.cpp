#include "model/layers/model_config.h"

#include <fmt/format.h>

#include "common/error.h"

namespace mltrain {
namespace {

void require_positive(int64_t value, const char* key) {
  if (value < 1) throw UserError(fmt::format("model.{} must be at least 1, got {}", key, value));
}

// parameters() in int64 is exact once the same sum in double is below kMaxParameters: each of
// its terms is at most the sum.
void check_countable(const ModelConfig& model) {
  const auto count = [](int64_t value) { return static_cast<double>(value); };
  const double q = count(model.n_q_heads) * count(model.head_dim);
  const double kv = count(model.n_kv_heads) * count(model.head_dim);
  const double d = count(model.d_model);
  const double block = 2 * d + 2 * d * q + 2 * d * kv + 3 * d * count(model.d_ffn);
  const double total = count(model.vocab_size) * d * (model.tie_word_embeddings ? 1 : 2) +
                       count(model.n_layers) * block + d;
  if (total <= static_cast<double>(ModelConfig::kMaxParameters)) return;
  throw UserError(fmt::format(
      "the model.* keys describe a model of {:.3g} parameters, more than the {:.3g} mltrain can "
      "train: model.vocab_size {}, d_model {}, n_layers {}, n_q_heads {}, n_kv_heads {}, "
      "head_dim {}, d_ffn {}",
      total, static_cast<double>(ModelConfig::kMaxParameters), model.vocab_size, model.d_model,
      model.n_layers, model.n_q_heads, model.n_kv_heads, model.head_dim, model.d_ffn));
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
  check_countable(*this);
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
