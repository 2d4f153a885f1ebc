#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "common/atomic_file.h"
#include "data/mapped_file.h"
#include "data/shard.h"

namespace mltrain {

// A loss mask: whether each token of a token shard is a training target (mlprep --format chat:
// the assistant's answers are, the prompts and the template's markers are not). It lives beside
// its shard, PREFIX_NNNNNN.mask for PREFIX_NNNNNN.bin, so the shard keeps llm.c's layout and
// every tool that reads shards reads it still. A header of 256 little-endian int32, as a shard's:
// [0] magic, [1] version, [2] the token count, [3] and [4] the low and high halves of the shard's
// token hash (ShardReader::token_hash), which ties the mask to the shard it was made with; then
// one byte a token, 1 for a target and 0 for none.
inline constexpr int32_t kLossMaskMagic = 20261207;
inline constexpr int32_t kLossMaskVersion = 1;

// The mask's path for a shard's: the extension .bin replaced by .mask.
std::filesystem::path loss_mask_path(const std::filesystem::path& shard);

// One shard's mask, written as its tokens are (ShardFileWriter): only a small buffer is held,
// and the file appears under its name only at commit().
class LossMaskFileWriter {
 public:
  explicit LossMaskFileWriter(const std::filesystem::path& path);
  void append(std::span<const uint8_t> targets);
  // `shard_token_hash`: ShardFileWriter::token_hash of the shard these targets belong to.
  void commit(uint64_t shard_token_hash);

 private:
  void flush();

  AtomicFileWriter file_;
  int64_t num_tokens_ = 0;
  std::vector<uint8_t> buffer_;
};

// A shard's mask, mapped read-only and validated as strictly as the shard: the header, a file
// size of exactly header + count, a count equal to the shard's, the shard's token hash (a mask
// made for other tokens, or a shard made again without its mask, is refused), and every byte 0
// or 1. Each failure is a UserError naming the file and the problem. The file must then stay as
// it is (MappedFile), like the shard.
class LossMaskReader {
 public:
  LossMaskReader(std::filesystem::path path, const ShardReader& shard);

  int64_t num_tokens() const { return num_tokens_; }

  // Copies the targets of tokens [start, start + out.size()) into out.
  void read(int64_t start, std::span<uint8_t> out) const;

  // The targets of each of `windows` windows of seq_len + 1 tokens at stride seq_len: the flags
  // of tokens [w seq_len + 1, (w + 1) seq_len], summed, in one pass over the file.
  std::vector<int32_t> targets_per_window(int64_t seq_len, int64_t windows) const;

 private:
  MappedFile file_;
  int64_t num_tokens_ = 0;
};

}  // namespace mltrain
