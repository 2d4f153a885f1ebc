#pragma once

#include <cstdint>

namespace mltrain {

// The shape of a LLaMA-style decoder. The defaults are the 0.04B MiniLLaMA of the model chapter
// (DESIGN.md's table); the YAML keys under `model:` have these names.
struct ModelConfig {
  // The most parameters a model may have: hundreds of times the largest ever trained, so that
  // every count derived from the shape (bytes, FLOPs, parts per rank) stays far inside 64 bits.
  static constexpr int64_t kMaxParameters = int64_t{1} << 48;

  int64_t vocab_size = 4096;
  int64_t d_model = 512;
  int64_t n_layers = 12;
  int64_t n_q_heads = 8;
  int64_t n_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t d_ffn = 1408;
  int64_t max_seq_len = 1024;
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  double init_std = 0.02;

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
