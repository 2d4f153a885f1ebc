#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/document_reader.h"

namespace mltrain {

// The tokenizer's training text: every document whose seeded hash is below a cutoff, the highest
// cutoff that keeps the sample within `max_bytes`. The order of the documents and how they are cut
// into files do not change it, and it stays within max_bytes however large the corpus. In hash
// order.
std::vector<std::string> tokenizer_sample(const std::vector<std::filesystem::path>& inputs,
                                          const DocumentReaderOptions& reader, int64_t max_bytes,
                                          uint64_t seed);

}  // namespace mltrain
