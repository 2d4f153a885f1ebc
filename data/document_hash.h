#pragma once

#include <xxhash.h>

#include <cstdint>
#include <string_view>

namespace mltrain {

// A seeded 64-bit hash of a document's text (XXH3): the same on every machine and in every run,
// so that the choices made from it (the validation split, the tokenizer's sample) are too.
inline uint64_t document_hash(std::string_view text, uint64_t seed) {
  return XXH3_64bits_withSeed(text.data(), text.size(), seed);
}

}  // namespace mltrain
