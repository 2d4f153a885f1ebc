#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/generation/sampling.h"
#include "model/layers/llama.h"

namespace mltrain {

struct GenerationOptions {
  SamplingOptions sampling;
  uint64_t seed = 1337;  // each prompt draws from its own CPU generator seeded with it
  int64_t max_new_tokens = 64;
  std::optional<int64_t> stop;  // the token that ends a sequence (end of document)
  // Tokens are chosen among ids below it, those the tokenizer can spell; 0: the whole vocabulary.
  // A model's vocab_size may exceed its tokenizer's (rounded up for speed).
  int64_t vocab_limit = 0;
};

struct Generation {
  std::vector<std::vector<int64_t>> tokens;  // per prompt, its new tokens (with `stop` if made)
  double prefill_seconds = 0.0;              // the prompts' forward pass
  double decode_seconds = 0.0;               // choosing every new token and feeding them back
};

// Called with (prompt index, token) as each new token is chosen, in order for each prompt.
using TokenCallback = std::function<void(size_t prompt, int64_t token)>;

// Continues each prompt (non-empty token lists): feeds the prompts once, then one token per step
// through a KV cache, until a prompt has max_new_tokens new tokens, produced `stop`, or filled
// model.max_seq_len (a prompt of exactly max_seq_len tokens still gets the token predicted after
// it). Prompts of different lengths share one left-padded batch with positions and attention per
// row (kv_cache.h), and each draws from its own generator, so every prompt gets the tokens it
// would get alone, up to floating-point rounding. Tokens are chosen on the CPU from fp32 logits,
// so the device changes them only as far as it changes the logits.
Generation generate(Llama& model, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerationOptions& options, const TokenCallback& on_token = {});

}  // namespace mltrain
