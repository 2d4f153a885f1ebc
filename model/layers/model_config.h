#pragma once

#include <cstdint>

namespace mltrain {

// The keys of the config's `model:` section, each declared once, here:
// KEY(section, type, name, default, doc line, check). The defaults are the 0.04B MiniLLaMA of the
// model chapter (the README's first paragraph). ModelConfig's fields are made from this list, and
// the trainer's config (trainer/config/config.cpp) reads, checks, writes and documents the keys
// from it; the checks (at_least, between, one_of, or {} for none) are the config's.
#define MLTRAIN_MODEL_KEYS(KEY, S)                                                               \
  KEY(S, int64_t, vocab_size, 4096, "tokens in the vocabulary", at_least(1))                     \
  KEY(S, int64_t, d_model, 512, "width of the residual stream", at_least(1))                     \
  KEY(S, int64_t, n_layers, 12, "decoder blocks", at_least(1))                                   \
  KEY(S, int64_t, n_q_heads, 8, "query heads per attention layer", at_least(1))                  \
  KEY(S, int64_t, n_kv_heads, 2, "key/value heads (grouped-query attention); divides n_q_heads", \
      at_least(1))                                                                               \
  KEY(S, int64_t, head_dim, 64, "width of one attention head (even)", at_least(2))               \
  KEY(S, int64_t, d_ffn, 1408, "hidden width of the SwiGLU feed-forward", at_least(1))           \
  KEY(S, int64_t, max_seq_len, 1024, "longest sequence the rotary tables cover", at_least(1))    \
  KEY(S, double, rope_theta, 10000.0, "rotary embedding base", at_least(1))                      \
  KEY(S, double, norm_eps, 1e-6, "RMSNorm epsilon", at_least(0))                                 \
  KEY(S, bool, tie_word_embeddings, true, "output projection shares the embedding matrix", {})   \
  KEY(S, double, init_std, 0.02, "standard deviation of the initial weights", at_least(0))

// A field of a key list (MLTRAIN_MODEL_KEYS and trainer/config/config.h's): the field and its
// default.
#define MLTRAIN_CONFIG_FIELD(section, type, name, default_value, doc, check) \
  type name = default_value;

// The shape of a LLaMA-style decoder: the keys above.
struct ModelConfig {
  // The most parameters a model may have: hundreds of times the largest ever trained, so that
  // every count derived from the shape (bytes, FLOPs, parts per rank) stays far inside 64 bits.
  static constexpr int64_t kMaxParameters = int64_t{1} << 48;

  MLTRAIN_MODEL_KEYS(MLTRAIN_CONFIG_FIELD, model)

  // Throws UserError naming the `model.*` key when the values cannot describe a model, or
  // describe one of more than kMaxParameters.
  void validate() const;

  // The parameters of one decoder block: two norm weights, the four attention projections and
  // the three SwiGLU projections.
  int64_t block_parameters() const;
  // Every parameter of the model (the tied embedding counted once), without building it.
  int64_t parameters() const;
};

}  // namespace mltrain
