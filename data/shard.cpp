#include "data/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/error.h"
#include "data/loss_mask.h"

namespace mltrain {
namespace {

// The largest id in a run of tokens. A plain loop over a fixed-width type: GCC vectorises it.
template <class Token>
Token max_token(const Token* tokens, int64_t count) {
  Token largest = 0;
  for (int64_t i = 0; i < count; ++i) largest = std::max(largest, tokens[i]);
  return largest;
}

template <class Token>
void widen(const unsigned char* bytes, std::span<int64_t> out) {
  const Token* tokens = reinterpret_cast<const Token*>(bytes);
  std::copy(tokens, tokens + out.size(), out.begin());
}

}  // namespace

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

namespace {

// Tokens are narrowed and buffered in blocks of this many before they are written.
constexpr size_t kWriteBlockTokens = size_t{1} << 18;

}  // namespace

ShardFileWriter::ShardFileWriter(const std::filesystem::path& path, int64_t vocab_size)
    : file_(path),
      hash_(XXH3_createState(), &XXH3_freeState),
      token_bytes_(token_bytes_for_vocab(vocab_size)) {
  if (!hash_ || XXH3_64bits_reset(hash_.get()) != XXH_OK) throw std::bad_alloc();
  const std::array<int32_t, kShardHeaderInts> placeholder{};
  file_.write(placeholder.data(), sizeof(placeholder));
  buffer_.reserve(kWriteBlockTokens * token_bytes_);
}

void ShardFileWriter::append(std::span<const uint32_t> tokens) {
  if (num_tokens_ + static_cast<int64_t>(tokens.size()) > kMaxShardTokens) {
    throw std::runtime_error(fmt::format("a shard holds at most {} tokens", kMaxShardTokens));
  }
  num_tokens_ += static_cast<int64_t>(tokens.size());
  const size_t block_bytes = kWriteBlockTokens * token_bytes_;
  while (!tokens.empty()) {
    const size_t taken = std::min((block_bytes - buffer_.size()) / token_bytes_, tokens.size());
    const size_t at = buffer_.size();
    buffer_.resize(at + taken * token_bytes_);
    unsigned char* out = buffer_.data() + at;
    if (token_bytes_ == 4) {
      std::memcpy(out, tokens.data(), taken * 4);
    } else {
      for (size_t i = 0; i < taken; ++i) {
        const auto narrow = static_cast<uint16_t>(tokens[i]);
        std::memcpy(out + 2 * i, &narrow, 2);
      }
    }
    tokens = tokens.subspan(taken);
    if (buffer_.size() == block_bytes) flush();
  }
}

void ShardFileWriter::flush() {
  XXH3_64bits_update(hash_.get(), buffer_.data(), buffer_.size());
  file_.write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

uint64_t ShardFileWriter::token_hash() {
  flush();  // the buffered tokens count too
  return XXH3_64bits_digest(hash_.get());
}

void ShardFileWriter::commit() {
  flush();
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = token_bytes_ == 2 ? kShardMagicU16 : kShardMagicU32;
  header[1] = token_bytes_ == 2 ? kShardVersionU16 : kShardVersionU32;
  const auto count = static_cast<uint32_t>(num_tokens_);
  std::memcpy(&header[2], &count, sizeof(count));
  file_.write_at(0, header.data(), sizeof(header));
  file_.commit();
}

void write_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                 int64_t vocab_size) {
  ShardFileWriter shard(path, vocab_size);
  shard.append(tokens);
  shard.commit();
}

ShardSeriesWriter::ShardSeriesWriter(std::filesystem::path directory, std::string prefix,
                                     int64_t vocab_size, int64_t shard_tokens, bool with_loss_masks)
    : directory_(std::move(directory)),
      prefix_(std::move(prefix)),
      vocab_size_(vocab_size),
      shard_tokens_(shard_tokens),
      with_loss_masks_(with_loss_masks) {
  if (shard_tokens < 1 || shard_tokens > kMaxShardTokens) {
    throw UserError(fmt::format("--shard-tokens {}: a shard holds 1 to {} tokens", shard_tokens,
                                kMaxShardTokens));
  }
}

ShardSeriesWriter::~ShardSeriesWriter() = default;

void ShardSeriesWriter::append(std::span<const uint32_t> tokens, std::span<const uint8_t> targets) {
  if (targets.size() != (with_loss_masks_ ? tokens.size() : 0)) {
    throw std::logic_error(fmt::format("{} tokens came with {} target flags to shards {} masks",
                                       tokens.size(), targets.size(),
                                       with_loss_masks_ ? "with" : "without"));
  }
  while (!tokens.empty()) {
    if (!current_) {
      const std::filesystem::path path =
          directory_ / fmt::format("{}_{:06d}.bin", prefix_, shards_);
      current_.emplace(path, vocab_size_);
      if (with_loss_masks_)
        current_mask_ = std::make_unique<LossMaskFileWriter>(loss_mask_path(path));
    }
    const auto room = static_cast<size_t>(shard_tokens_ - current_->num_tokens());
    const size_t taken = std::min(room, tokens.size());
    current_->append(tokens.first(taken));
    if (current_mask_) {
      current_mask_->append(targets.first(taken));
      targets = targets.subspan(taken);
    }
    num_tokens_ += static_cast<int64_t>(taken);
    tokens = tokens.subspan(taken);
    if (current_->num_tokens() == shard_tokens_) commit_current();
  }
}

void ShardSeriesWriter::commit_current() {
  // The mask first, so that no shard of a finished series lacks its mask; readers are kept from
  // a corpus until mlprep has published it whole (corpus_output.h).
  if (current_mask_) current_mask_->commit(current_->token_hash());
  current_->commit();
  current_.reset();
  current_mask_.reset();
  ++shards_;
}

int64_t ShardSeriesWriter::finish() {
  if (current_) commit_current();
  return shards_;
}

ShardReader::ShardReader(std::filesystem::path path, int64_t vocab_size)
    : file_(std::move(path), "token shard"), vocab_size_(vocab_size) {
  const auto fail = [this](const std::string& what) {
    return UserError(fmt::format("{}: {}", file_.path().string(), what));
  };
  const uint64_t file_bytes = file_.size();
  if (file_bytes < static_cast<uint64_t>(kShardHeaderBytes)) {
    throw fail(fmt::format("{} bytes is shorter than the {}-byte shard header", file_bytes,
                           kShardHeaderBytes));
  }
  int32_t header[3];
  file_.copy(0, sizeof(header), header);
  if (header[0] == kShardMagicU16 && header[1] == kShardVersionU16) {
    token_bytes_ = 2;
  } else if (header[0] == kShardMagicU32 && header[1] == kShardVersionU32) {
    token_bytes_ = 4;
  } else if (header[0] != kShardMagicU16 && header[0] != kShardMagicU32) {
    throw fail(fmt::format("offset 0: magic {} is not a token shard's ({} or {})", header[0],
                           kShardMagicU16, kShardMagicU32));
  } else {
    throw fail(fmt::format("offset 4: unknown version {} for magic {}", header[1], header[0]));
  }
  uint32_t count = 0;
  std::memcpy(&count, &header[2], sizeof(count));
  num_tokens_ = count;
  const uint64_t expected = kShardHeaderBytes + static_cast<uint64_t>(num_tokens_) * token_bytes_;
  if (file_bytes != expected) {
    throw fail(
        fmt::format("offset 8: the header counts {} tokens ({} bytes in all) but the file "
                    "has {} bytes ({})",
                    num_tokens_, expected, file_bytes,
                    file_bytes < expected ? "truncated" : "longer than its count"));
  }
  check_token_ids();
  // Training reads windows at random places.
  file_.advise_random();
}

void ShardReader::check_token_ids() const {
  file_.advise_sequential();
  int64_t largest = 0;
  file_.read_in_place(
      kShardHeaderBytes, file_.size() - kShardHeaderBytes, [&](const unsigned char* tokens) {
        if (token_bytes_ == 2) {
          largest = max_token(reinterpret_cast<const uint16_t*>(tokens), num_tokens_);
        } else {
          largest = max_token(reinterpret_cast<const uint32_t*>(tokens), num_tokens_);
        }
      });
  if (largest < vocab_size_) return;
  // Rare: find the first offender for the message.
  int64_t index = 0;
  int64_t token = 0;
  file_.read_in_place(
      kShardHeaderBytes, file_.size() - kShardHeaderBytes, [&](const unsigned char* tokens) {
        for (; index < num_tokens_; ++index) {
          token = token_bytes_ == 2 ? reinterpret_cast<const uint16_t*>(tokens)[index]
                                    : reinterpret_cast<const uint32_t*>(tokens)[index];
          if (token >= vocab_size_) return;
        }
      });
  throw UserError(fmt::format(
      "{}: offset {}: token {} (index {}) is not below the vocabulary size {} (model.vocab_size): "
      "was the shard made with another tokenizer?",
      path().string(), kShardHeaderBytes + index * token_bytes_, token, index, vocab_size_));
}

void ShardReader::read(int64_t start, std::span<int64_t> out) const {
  file_.read_in_place(kShardHeaderBytes + start * token_bytes_,
                      out.size() * static_cast<size_t>(token_bytes_),
                      [&](const unsigned char* bytes) {
                        if (token_bytes_ == 2) {
                          widen<uint16_t>(bytes, out);
                        } else {
                          widen<uint32_t>(bytes, out);
                        }
                      });
  // Opening checked every id; one that is out of range now was written since, where the file's
  // times did not tell (a network filesystem's cached attributes): an id past the embedding would
  // end a CUDA run with a device-side assert instead of this line.
  if (!out.empty() && *std::max_element(out.begin(), out.end()) >= vocab_size_)
    file_.fail_changed("");
}

uint64_t ShardReader::token_hash() const {
  uint64_t hash = 0;
  file_.read_in_place(kShardHeaderBytes, file_.size() - kShardHeaderBytes,
                      [&](const unsigned char* tokens) {
                        hash = XXH3_64bits(tokens, file_.size() - kShardHeaderBytes);
                      });
  return hash;
}

}  // namespace mltrain
