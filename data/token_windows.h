#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/shard.h"

namespace mltrain {

// The training (or validation) windows of a corpus: the shards matching a glob, in sorted order;
// in each, windows of seq_len + 1 tokens at stride seq_len that never cross the shard's end.
// Window i of the corpus is numbered across shards in that order.
class TokenWindows {
 public:
  // Opens and validates every shard (see ShardReader). An empty glob, or a shard too short for
  // one window, is a UserError naming the pattern or the file.
  TokenWindows(const std::string& pattern, int64_t seq_len, int64_t vocab_size);

  int64_t num_windows() const { return window_starts_.back(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t window_length() const { return seq_len_ + 1; }
  const std::vector<ShardReader>& shards() const { return shards_; }

  // Copies window `index` (seq_len + 1 tokens) into out.
  void read(int64_t index, std::span<int64_t> out) const;

 private:
  int64_t seq_len_;
  int64_t num_tokens_ = 0;
  std::vector<ShardReader> shards_;
  // window_starts_[s] is the index of shard s's first window; the last entry is the total.
  std::vector<int64_t> window_starts_;
};

// The shard paths a glob matches, sorted; a UserError naming the pattern when there are none.
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace mltrain
