#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"
#include "data/mapping_read_guard.h"

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
    : file_(path), token_bytes_(token_bytes_for_vocab(vocab_size)) {
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
  file_.write(buffer_.data(), buffer_.size());
  buffer_.clear();
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
                                     int64_t vocab_size, int64_t shard_tokens)
    : directory_(std::move(directory)),
      prefix_(std::move(prefix)),
      vocab_size_(vocab_size),
      shard_tokens_(shard_tokens) {
  if (shard_tokens < 1 || shard_tokens > kMaxShardTokens) {
    throw UserError(fmt::format("--shard-tokens {}: a shard holds 1 to {} tokens", shard_tokens,
                                kMaxShardTokens));
  }
}

void ShardSeriesWriter::append(std::span<const uint32_t> tokens) {
  while (!tokens.empty()) {
    if (!current_) {
      current_.emplace(directory_ / fmt::format("{}_{:06d}.bin", prefix_, shards_), vocab_size_);
    }
    const auto room = static_cast<size_t>(shard_tokens_ - current_->num_tokens());
    const size_t taken = std::min(room, tokens.size());
    current_->append(tokens.first(taken));
    num_tokens_ += static_cast<int64_t>(taken);
    tokens = tokens.subspan(taken);
    if (current_->num_tokens() == shard_tokens_) {
      current_->commit();
      current_.reset();
      ++shards_;
    }
  }
}

int64_t ShardSeriesWriter::finish() {
  if (current_) {
    current_->commit();
    current_.reset();
    ++shards_;
  }
  return shards_;
}

namespace {

int64_t nanoseconds(const struct timespec& time) {
  return static_cast<int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

}  // namespace

ShardReader::ShardReader(std::filesystem::path path, int64_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size) {
  const auto fail = [this](const std::string& what) {
    return UserError(fmt::format("{}: {}", path_.string(), what));
  };
  const InputFile file(path_, "token shard");
  struct stat status {};
  if (::fstat(file.fd(), &status) != 0)
    throw fail(fmt::format("cannot read token shard: {}", std::strerror(errno)));
  opened_ = {status.st_dev, status.st_ino, status.st_size, nanoseconds(status.st_mtim),
             nanoseconds(status.st_ctim)};
  const uint64_t file_bytes = file.size();
  if (file_bytes < static_cast<uint64_t>(kShardHeaderBytes)) {
    throw fail(fmt::format("{} bytes is shorter than the {}-byte shard header", file_bytes,
                           kShardHeaderBytes));
  }
  // The mapping keeps the file open once `file` closes its descriptor.
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (mapping == MAP_FAILED) throw fail(fmt::format("cannot map: {}", std::strerror(errno)));
  mapping_ = static_cast<const unsigned char*>(mapping);
  mapping_bytes_ = file_bytes;

  try {
    int32_t header[3];
    {
      const MappingReadGuard guard(mapping_, sizeof(header));
      std::memcpy(header, mapping_, sizeof(header));
      if (guard.faulted()) fail_changed(change_since_opened());
    }
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
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(mapping_), mapping_bytes_);
    throw;
  }
  // Training reads windows at random places.
  ::madvise(const_cast<unsigned char*>(mapping_), mapping_bytes_, MADV_RANDOM);
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      vocab_size_(other.vocab_size_),
      opened_(other.opened_),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(other.mapping_bytes_),
      num_tokens_(other.num_tokens_),
      token_bytes_(other.token_bytes_) {}

ShardReader::~ShardReader() {
  if (mapping_ != nullptr) ::munmap(const_cast<unsigned char*>(mapping_), mapping_bytes_);
}

void ShardReader::check_token_ids() const {
  const unsigned char* tokens = mapping_ + kShardHeaderBytes;
  ::madvise(const_cast<unsigned char*>(mapping_), mapping_bytes_, MADV_SEQUENTIAL);
  const MappingReadGuard guard(mapping_, mapping_bytes_);
  const int64_t largest = token_bytes_ == 2
                              ? max_token(reinterpret_cast<const uint16_t*>(tokens), num_tokens_)
                              : max_token(reinterpret_cast<const uint32_t*>(tokens), num_tokens_);
  if (guard.faulted()) fail_changed(change_since_opened());
  if (largest < vocab_size_) return;
  // Rare: find the first offender for the message.
  for (int64_t i = 0; i < num_tokens_; ++i) {
    const int64_t token = token_bytes_ == 2 ? reinterpret_cast<const uint16_t*>(tokens)[i]
                                            : reinterpret_cast<const uint32_t*>(tokens)[i];
    if (token >= vocab_size_) {
      throw UserError(
          fmt::format("{}: offset {}: token {} (index {}) is not below the vocabulary "
                      "size {} (model.vocab_size): was the shard made with another "
                      "tokenizer?",
                      path_.string(), kShardHeaderBytes + i * token_bytes_, token, i, vocab_size_));
    }
  }
}

std::string ShardReader::change_since_opened() const {
  struct stat status {};
  if (::stat(path_.c_str(), &status) != 0) return "it was removed";
  if (status.st_dev != opened_.device || status.st_ino != opened_.inode)
    return "another file was put in its place";
  if (status.st_size != opened_.bytes) {
    return fmt::format("it was {} bytes and is now {} ({})", opened_.bytes, status.st_size,
                       status.st_size < opened_.bytes ? "truncated" : "it grew");
  }
  // The change time too: a write whose modification time was put back (touch -r) still sets it.
  if (nanoseconds(status.st_mtim) != opened_.modified_ns ||
      nanoseconds(status.st_ctim) != opened_.changed_ns)
    return "it was written to";
  return "";
}

void ShardReader::fail_changed(const std::string& what) const {
  throw std::runtime_error(fmt::format(
      "{}: the token shard changed while mltrain read it ({}): a shard must stay as it is while "
      "a run reads it; restore it, then resume from the last checkpoint",
      path_.string(),
      what.empty() ? "its tokens are no longer the ones it was opened with" : what));
}

void ShardReader::read(int64_t start, std::span<int64_t> out) const {
  if (const std::string change = change_since_opened(); !change.empty()) fail_changed(change);
  const unsigned char* bytes = mapping_ + kShardHeaderBytes + start * token_bytes_;
  const MappingReadGuard guard(bytes, out.size() * static_cast<size_t>(token_bytes_));
  if (token_bytes_ == 2) {
    widen<uint16_t>(bytes, out);
  } else {
    widen<uint32_t>(bytes, out);
  }
  if (guard.faulted()) fail_changed(change_since_opened());
  // Opening checked every id; one that is out of range now was written since, where the file's
  // times did not tell (a network filesystem's cached attributes): an id past the embedding would
  // end a CUDA run with a device-side assert instead of this line.
  if (!out.empty() && *std::max_element(out.begin(), out.end()) >= vocab_size_) fail_changed("");
}

}  // namespace mltrain
