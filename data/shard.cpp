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
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"

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

void write_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                 int64_t vocab_size) {
  const int token_bytes = token_bytes_for_vocab(vocab_size);
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = token_bytes == 2 ? kShardMagicU16 : kShardMagicU32;
  header[1] = token_bytes == 2 ? kShardVersionU16 : kShardVersionU32;
  const uint32_t count = static_cast<uint32_t>(tokens.size());
  std::memcpy(&header[2], &count, sizeof(count));

  AtomicFileWriter file(path);
  file.write(header.data(), sizeof(header));
  if (token_bytes == 4) {
    file.write(tokens.data(), tokens.size_bytes());
  } else {
    // Narrowed in blocks so a large shard needs no second full-size buffer.
    std::vector<uint16_t> block;
    for (size_t start = 0; start < tokens.size(); start += 1 << 20) {
      const auto part = tokens.subspan(start, std::min<size_t>(1 << 20, tokens.size() - start));
      block.assign(part.begin(), part.end());
      file.write(block.data(), block.size() * sizeof(uint16_t));
    }
  }
  file.commit();
}

ShardReader::ShardReader(std::filesystem::path path, int64_t vocab_size) : path_(std::move(path)) {
  const auto fail = [this](const std::string& what) {
    return UserError(fmt::format("{}: {}", path_.string(), what));
  };
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(fmt::format("cannot open token shard: {}", std::strerror(errno)));
  struct stat status {};
  ::fstat(fd, &status);
  const uint64_t file_bytes = static_cast<uint64_t>(status.st_size);
  if (file_bytes < static_cast<uint64_t>(kShardHeaderBytes)) {
    ::close(fd);
    throw fail(fmt::format("{} bytes is shorter than the {}-byte shard header", file_bytes,
                           kShardHeaderBytes));
  }
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (mapping == MAP_FAILED) throw fail(fmt::format("cannot map: {}", std::strerror(errno)));
  mapping_ = static_cast<const unsigned char*>(mapping);
  mapping_bytes_ = file_bytes;

  try {
    int32_t header[3];
    std::memcpy(header, mapping_, sizeof(header));
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
    check_token_ids(vocab_size);
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(mapping_), mapping_bytes_);
    throw;
  }
  // Training reads windows at random places.
  ::madvise(const_cast<unsigned char*>(mapping_), mapping_bytes_, MADV_RANDOM);
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(other.mapping_bytes_),
      num_tokens_(other.num_tokens_),
      token_bytes_(other.token_bytes_) {}

ShardReader::~ShardReader() {
  if (mapping_ != nullptr) ::munmap(const_cast<unsigned char*>(mapping_), mapping_bytes_);
}

void ShardReader::check_token_ids(int64_t vocab_size) const {
  const unsigned char* tokens = mapping_ + kShardHeaderBytes;
  ::madvise(const_cast<unsigned char*>(mapping_), mapping_bytes_, MADV_SEQUENTIAL);
  const int64_t largest = token_bytes_ == 2
                              ? max_token(reinterpret_cast<const uint16_t*>(tokens), num_tokens_)
                              : max_token(reinterpret_cast<const uint32_t*>(tokens), num_tokens_);
  if (largest < vocab_size) return;
  // Rare: find the first offender for the message.
  std::vector<int64_t> one(1);
  for (int64_t i = 0; i < num_tokens_; ++i) {
    read(i, one);
    if (one[0] >= vocab_size) {
      throw UserError(
          fmt::format("{}: offset {}: token {} (index {}) is not below the vocabulary "
                      "size {} (model.vocab_size): was the shard made with another "
                      "tokenizer?",
                      path_.string(), kShardHeaderBytes + i * token_bytes_, one[0], i, vocab_size));
    }
  }
}

void ShardReader::read(int64_t start, std::span<int64_t> out) const {
  const unsigned char* bytes = mapping_ + kShardHeaderBytes + start * token_bytes_;
  if (token_bytes_ == 2) {
    widen<uint16_t>(bytes, out);
  } else {
    widen<uint32_t>(bytes, out);
  }
}

}  // namespace mltrain
