#include "data/token_windows.h"

#include <glob.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "common/error.h"
#include "data/corpus_description.h"
#include "data/corpus_output.h"

namespace mltrain {

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t matches{};
  const int result = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  ::globfree(&matches);
  if (result != 0 || paths.empty()) {
    throw UserError(
        fmt::format("no token shards match {} (prepare a corpus with mlprep, or name the shards "
                    "it wrote)",
                    pattern));
  }
  std::sort(paths.begin(), paths.end());
  std::set<std::filesystem::path> directories;
  for (const std::string& path : paths)
    directories.insert(std::filesystem::path(path).parent_path());
  for (const std::filesystem::path& directory : directories) refuse_half_replaced_corpus(directory);
  return paths;
}

TokenWindows::TokenWindows(const std::string& pattern, int64_t seq_len, int64_t vocab_size)
    : seq_len_(seq_len) {
  window_starts_.push_back(0);
  const std::vector<std::string> paths = expand_glob(pattern);
  std::map<std::filesystem::path, CorpusDescription> descriptions;
  auto last_report = std::chrono::steady_clock::now();
  for (const std::string& path : paths) {
    // Validation reads every token: on a large corpus that takes a while, so say how far it is.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::seconds(5)) {
      spdlog::info("validating shards: {}/{} ({} tokens so far)", shards_.size(), paths.size(),
                   num_tokens_);
      last_report = now;
    }
    ShardReader shard(path, vocab_size);
    const int64_t windows = shard.num_tokens() > seq_len ? (shard.num_tokens() - 1) / seq_len : 0;
    if (windows == 0) {
      throw UserError(
          fmt::format("{}: {} tokens are fewer than one window of data.seq_len + 1 = "
                      "{} tokens",
                      path, shard.num_tokens(), seq_len + 1));
    }
    const std::filesystem::path directory = std::filesystem::path(path).parent_path();
    if (!descriptions.contains(directory))
      descriptions[directory] = read_corpus_description(directory);
    std::unique_ptr<LossMaskReader> mask;
    if (descriptions[directory].loss_masks) {
      const std::filesystem::path mask_path = loss_mask_path(path);
      std::error_code error;
      if (!std::filesystem::exists(mask_path, error)) {
        throw UserError(fmt::format(
            "{}: missing: its corpus has loss masks ({} says so), and every shard's is beside "
            "it; prepare the corpus again with mlprep",
            mask_path.string(), (directory / kCorpusDescriptionFile).string()));
      }
      mask = std::make_unique<LossMaskReader>(mask_path, shard);
    }
    num_tokens_ += shard.num_tokens();
    window_starts_.push_back(window_starts_.back() + windows);
    shards_.push_back(std::move(shard));
    masks_.push_back(std::move(mask));
  }
  if (!has_loss_masks()) return;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const int64_t windows = window_starts_[s + 1] - window_starts_[s];
    const std::vector<int32_t> counts =
        masks_[s]
            ? masks_[s]->targets_per_window(seq_len_, windows)
            : std::vector<int32_t>(static_cast<size_t>(windows), static_cast<int32_t>(seq_len_));
    window_targets_.insert(window_targets_.end(), counts.begin(), counts.end());
  }
}

int64_t TokenWindows::targets_in_window(int64_t index) const {
  return window_targets_.empty() ? seq_len_ : window_targets_[static_cast<size_t>(index)];
}

std::pair<size_t, int64_t> TokenWindows::locate(int64_t index) const {
  // The shard whose window range holds index: the last start not after it.
  const auto next = std::upper_bound(window_starts_.begin(), window_starts_.end() - 1, index);
  const size_t shard = static_cast<size_t>(next - window_starts_.begin()) - 1;
  return {shard, (index - window_starts_[shard]) * seq_len_};
}

void TokenWindows::read(int64_t index, std::span<int64_t> out) const {
  const auto [shard, start] = locate(index);
  shards_[shard].read(start, out.first(seq_len_ + 1));
}

bool TokenWindows::has_loss_masks() const {
  return std::any_of(masks_.begin(), masks_.end(),
                     [](const auto& mask) { return mask != nullptr; });
}

TokenWindows::LossMaskSummary TokenWindows::loss_mask_summary(int64_t end_of_document) const {
  constexpr int64_t kBlockTokens = int64_t{1} << 20;
  LossMaskSummary summary;
  std::vector<int64_t> tokens;
  std::vector<uint8_t> targets;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (!masks_[s]) continue;
    const int64_t count = shards_[s].num_tokens();
    int64_t document_length = 0;
    for (int64_t start = 0; start < count; start += kBlockTokens) {
      const auto block = static_cast<size_t>(std::min(kBlockTokens, count - start));
      tokens.resize(block);
      targets.resize(block);
      shards_[s].read(start, tokens);
      masks_[s]->read(start, targets);
      summary.targets += std::count(targets.begin(), targets.end(), uint8_t{1});
      for (const int64_t token : tokens) {
        ++document_length;
        if (token != end_of_document) continue;
        ++summary.documents;
        if (document_length > seq_len_ + 1) ++summary.documents_cut;
        document_length = 0;
      }
    }
    summary.tokens += count;
  }
  return summary;
}

void TokenWindows::read_targets(int64_t index, std::span<uint8_t> out) const {
  const auto [shard, start] = locate(index);
  if (masks_[shard]) {
    masks_[shard]->read(start + 1, out.first(seq_len_));
  } else {
    std::fill_n(out.begin(), seq_len_, uint8_t{1});
  }
}

}  // namespace mltrain
