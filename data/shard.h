#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <xxhash.h>

#include "common/atomic_file.h"
#include "data/mapped_file.h"

namespace mltrain {

class LossMaskFileWriter;

// The llm.c token shard: a header of 256 little-endian int32 ([0] magic, [1] version, [2] token
// count), then the tokens. Magic 20240520 / version 1 holds uint16 tokens; magic 20240801 /
// version 7 holds uint32 tokens, for vocabularies over 65,536. The count is read as unsigned, and
// every offset is 64-bit, so shards over 4 GiB work.
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;

// Bytes per token a shard for this vocabulary uses: 2 when every id fits uint16, else 4.
int token_bytes_for_vocab(int64_t vocab_size);

// The most tokens one shard holds: llm.c reads the header's count as a signed 32-bit int.
inline constexpr int64_t kMaxShardTokens = 0x7FFF'FFFF;

// One shard written as its tokens arrive, in the narrowest token type that holds vocab_size (ids
// must be below it): only a small buffer is held, the header's count is filled in by commit(), and
// the file appears under its name only then (AtomicFileWriter: a temporary name, fsync, rename).
// Destroyed without commit() it leaves nothing. Write failures throw std::runtime_error.
class ShardFileWriter {
 public:
  ShardFileWriter(const std::filesystem::path& path, int64_t vocab_size);
  void append(std::span<const uint32_t> tokens);
  int64_t num_tokens() const { return num_tokens_; }
  // The XXH3 hash of the token bytes appended so far (ShardReader::token_hash).
  uint64_t token_hash();
  void commit();

 private:
  void flush();

  AtomicFileWriter file_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash_;
  int token_bytes_;
  int64_t num_tokens_ = 0;
  std::vector<unsigned char> buffer_;
};

// Writes tokens as one shard, atomically (ShardFileWriter).
void write_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                 int64_t vocab_size);

// A split's shards, DIR/PREFIX_000000.bin, PREFIX_000001.bin..., written as tokens arrive: each
// shard holds `shard_tokens` tokens but the last, and appears complete or not at all, so an
// interrupted run leaves whole shards only. With loss masks, each shard's mask (loss_mask.h) is
// written beside it, cut where the shard is, and appears before it.
class ShardSeriesWriter {
 public:
  ShardSeriesWriter(std::filesystem::path directory, std::string prefix, int64_t vocab_size,
                    int64_t shard_tokens, bool with_loss_masks = false);
  ~ShardSeriesWriter();
  // `targets`: with loss masks, a flag (0 or 1) for each token; else empty.
  void append(std::span<const uint32_t> tokens, std::span<const uint8_t> targets = {});
  // Commits the last shard. Returns the number of shards written.
  int64_t finish();
  int64_t num_tokens() const { return num_tokens_; }

 private:
  void commit_current();

  std::filesystem::path directory_;
  std::string prefix_;
  int64_t vocab_size_;
  int64_t shard_tokens_;
  bool with_loss_masks_;
  int64_t shards_ = 0;
  int64_t num_tokens_ = 0;
  std::optional<ShardFileWriter> current_;
  std::unique_ptr<LossMaskFileWriter> current_mask_;
};

// A shard mapped read-only; never copied whole. Opening validates the header, that the file size
// is exactly header + count x token size, and, with a full vectorised scan, that every token id
// is below vocab_size. Each failure is a UserError naming the file, the offset and the problem.
// The shard must then stay as it is: a read that finds it truncated, replaced, modified or
// holding an id the scan did not see throws a runtime error that names the file and the change
// (MappedFile), where the mapping alone would have crashed (SIGBUS) or trained on other data.
class ShardReader {
 public:
  ShardReader(std::filesystem::path path, int64_t vocab_size);

  const std::filesystem::path& path() const { return file_.path(); }
  int64_t num_tokens() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }

  // Copies tokens [start, start + out.size()) into out, widened to int64.
  void read(int64_t start, std::span<int64_t> out) const;

  // The XXH3 hash of the token bytes (after the header), as ShardFileWriter::token_hash gives it:
  // what ties a loss mask to its shard (loss_mask.h). A full read of the file.
  uint64_t token_hash() const;

 private:
  void check_token_ids() const;

  MappedFile file_;
  int64_t vocab_size_;
  int64_t num_tokens_ = 0;
  int token_bytes_ = 0;
};

}  // namespace mltrain
