#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "data/loss_mask.h"
#include "data/shard.h"

namespace mltrain {

// The training (or validation) windows of a corpus: the shards matching a glob, in sorted order;
// in each, windows of seq_len + 1 tokens at stride seq_len that never cross the shard's end.
// Window i of the corpus is numbered across shards in that order. A shard whose directory says it
// has loss masks (corpus.json, corpus_description.h) is read with its mask, which says which of a
// window's targets count.
class TokenWindows {
 public:
  // Opens and validates every shard (see ShardReader) and mask (LossMaskReader). An empty glob, a
  // shard too short for one window, or a mask missing where its directory says there is one, is
  // a UserError naming the pattern or the file.
  TokenWindows(const std::string& pattern, int64_t seq_len, int64_t vocab_size);

  int64_t num_windows() const { return window_starts_.back(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t window_length() const { return seq_len_ + 1; }
  const std::vector<ShardReader>& shards() const { return shards_; }

  // Copies window `index` (seq_len + 1 tokens) into out.
  void read(int64_t index, std::span<int64_t> out) const;

  // Whether any shard has a loss mask; without, every target counts.
  bool has_loss_masks() const;
  // Over the shards with loss masks: their tokens and targets, and the documents (counted by
  // their `end_of_document` token) and those longer than a window, which windows cut. A pass over
  // those shards and masks.
  struct LossMaskSummary {
    int64_t tokens = 0;
    int64_t targets = 0;
    int64_t documents = 0;
    int64_t documents_cut = 0;
  };
  LossMaskSummary loss_mask_summary(int64_t end_of_document) const;
  // Whether each of window `index`'s seq_len targets (its tokens after the first) is one to train
  // on: 1 or 0 from the shard's loss mask, 1 for every target of a shard without one.
  void read_targets(int64_t index, std::span<uint8_t> out) const;
  // How many of window `index`'s targets count: counted once when the masks are opened, so that
  // a step's count reads no file.
  int64_t targets_in_window(int64_t index) const;

 private:
  // The shard that holds window `index`, and the window's first token in it.
  std::pair<size_t, int64_t> locate(int64_t index) const;

  int64_t seq_len_;
  int64_t num_tokens_ = 0;
  std::vector<ShardReader> shards_;
  std::vector<std::unique_ptr<LossMaskReader>> masks_;  // each shard's, or null
  std::vector<int32_t> window_targets_;  // with loss masks: each window's targets that count
  // window_starts_[s] is the index of shard s's first window; the last entry is the total.
  std::vector<int64_t> window_starts_;
};

// The shard paths a glob matches, sorted; a UserError naming the pattern when there are none.
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace mltrain
