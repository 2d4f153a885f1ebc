#include "data/token_windows.h"

#include <glob.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "common/error.h"
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
    num_tokens_ += shard.num_tokens();
    window_starts_.push_back(window_starts_.back() + windows);
    shards_.push_back(std::move(shard));
  }
}

void TokenWindows::read(int64_t index, std::span<int64_t> out) const {
  // The shard whose window range holds index: the last start not after it.
  const auto next = std::upper_bound(window_starts_.begin(), window_starts_.end() - 1, index);
  const size_t shard = static_cast<size_t>(next - window_starts_.begin()) - 1;
  shards_[shard].read((index - window_starts_[shard]) * seq_len_, out.first(seq_len_ + 1));
}

}  // namespace mltrain
