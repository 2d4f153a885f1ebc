#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/llama.h"

namespace mltrain {

// Greedy decoding: feeds the prompt once, then one token at a time through a KV cache, each time
// appending the most likely next token, until max_new_tokens are made, `stop` is produced, or the
// model's max_seq_len is reached. Returns the new tokens (with `stop` if it was produced).
std::vector<int64_t> generate_greedy(Llama& model, const std::vector<int64_t>& prompt,
                                     int64_t max_new_tokens,
                                     std::optional<int64_t> stop = std::nullopt);

}  // namespace mltrain
