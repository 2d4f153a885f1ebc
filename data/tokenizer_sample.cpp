#include "data/tokenizer_sample.h"

#include <algorithm>
#include <utility>

#include "data/document_hash.h"
#include "data/progress.h"

namespace mltrain {
namespace {

// The sample's hashes are salted so that it is not the validation split's lowest hashes.
constexpr uint64_t kSampleSalt = 0x9E3779B97F4A7C15ull;

}  // namespace

std::vector<std::string> tokenizer_sample(const std::vector<std::filesystem::path>& inputs,
                                          const DocumentReaderOptions& reader_options,
                                          int64_t max_bytes, uint64_t seed) {
  DocumentReader reader(inputs, reader_options);
  ProgressLog progress("sampling for the tokenizer", total_input_bytes(inputs));
  // A max-heap on the hash holds the candidates. When they pass max_bytes the highest leaves, and
  // the cutoff falls to its hash; a document at or above the cutoff stays out. The cutoff ends at
  // the first hash, in hash order, at which the documents' bytes pass max_bytes, whatever order
  // they come in, and the sample is every document below it.
  std::vector<std::pair<uint64_t, std::string>> kept;
  int64_t kept_bytes = 0;
  uint64_t cutoff = UINT64_MAX;
  while (std::optional<std::string> document = reader.next()) {
    const uint64_t hash = document_hash(*document, seed ^ kSampleSalt);
    if (hash >= cutoff) continue;
    kept_bytes += static_cast<int64_t>(document->size());
    kept.emplace_back(hash, std::move(*document));
    std::push_heap(kept.begin(), kept.end());
    while (kept_bytes > max_bytes) {
      std::pop_heap(kept.begin(), kept.end());
      cutoff = kept.back().first;
      kept_bytes -= static_cast<int64_t>(kept.back().second.size());
      kept.pop_back();
    }
    if (progress.due()) progress.log(reader.bytes_read());
  }
  // Documents of the cutoff's own hash that came before it was reached (copies of one text).
  std::erase_if(kept, [&](const auto& entry) { return entry.first >= cutoff; });
  std::sort(kept.begin(), kept.end());
  std::vector<std::string> sample;
  sample.reserve(kept.size());
  for (auto& [hash, text] : kept) sample.push_back(std::move(text));
  return sample;
}

}  // namespace mltrain
