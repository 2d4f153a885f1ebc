#include "data/loss_mask.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "common/error.h"

namespace mltrain {
namespace {

// Targets are buffered in blocks of this many before they are written.
constexpr size_t kWriteBlockBytes = size_t{1} << 18;

// The index of the first byte that is neither 0 nor 1, or `count` when there is none.
size_t first_non_flag(const uint8_t* bytes, size_t count) {
  // Or-ing every byte is vectorised; only a mask that fails looks for where.
  uint8_t any = 0;
  for (size_t i = 0; i < count; ++i) any |= bytes[i];
  if (any <= 1) return count;
  return static_cast<size_t>(std::find_if(bytes, bytes + count, [](uint8_t b) { return b > 1; }) -
                             bytes);
}

}  // namespace

std::filesystem::path loss_mask_path(const std::filesystem::path& shard) {
  std::filesystem::path mask = shard;
  return mask.replace_extension(".mask");
}

LossMaskFileWriter::LossMaskFileWriter(const std::filesystem::path& path) : file_(path) {
  const std::array<int32_t, kShardHeaderInts> placeholder{};
  file_.write(placeholder.data(), sizeof(placeholder));
  buffer_.reserve(kWriteBlockBytes);
}

void LossMaskFileWriter::append(std::span<const uint8_t> targets) {
  num_tokens_ += static_cast<int64_t>(targets.size());
  while (!targets.empty()) {
    const size_t taken = std::min(kWriteBlockBytes - buffer_.size(), targets.size());
    buffer_.insert(buffer_.end(), targets.begin(), targets.begin() + static_cast<ptrdiff_t>(taken));
    targets = targets.subspan(taken);
    if (buffer_.size() == kWriteBlockBytes) flush();
  }
}

void LossMaskFileWriter::flush() {
  file_.write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void LossMaskFileWriter::commit(uint64_t shard_token_hash) {
  flush();
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kLossMaskMagic;
  header[1] = kLossMaskVersion;
  const auto count = static_cast<uint32_t>(num_tokens_);
  std::memcpy(&header[2], &count, sizeof(count));
  std::memcpy(&header[3], &shard_token_hash, sizeof(shard_token_hash));
  file_.write_at(0, header.data(), sizeof(header));
  file_.commit();
}

LossMaskReader::LossMaskReader(std::filesystem::path path, const ShardReader& shard)
    : file_(std::move(path), "loss mask") {
  const auto fail = [&](const std::string& what) {
    return UserError(fmt::format("{}: {}", file_.path().string(), what));
  };
  if (file_.size() < static_cast<size_t>(kShardHeaderBytes)) {
    throw fail(fmt::format("{} bytes is shorter than the {}-byte loss mask header", file_.size(),
                           kShardHeaderBytes));
  }
  std::array<int32_t, 5> header{};
  file_.copy(0, sizeof(header), header.data());
  if (header[0] != kLossMaskMagic)
    throw fail(
        fmt::format("offset 0: magic {} is not a loss mask's ({})", header[0], kLossMaskMagic));
  if (header[1] != kLossMaskVersion)
    throw fail(fmt::format("offset 4: unknown loss mask version {}", header[1]));
  uint32_t count = 0;
  std::memcpy(&count, &header[2], sizeof(count));
  num_tokens_ = count;
  const uint64_t expected = kShardHeaderBytes + static_cast<uint64_t>(num_tokens_);
  if (file_.size() != expected) {
    throw fail(fmt::format(
        "offset 8: the header counts {} tokens ({} bytes in all) but the file has {} bytes ({})",
        num_tokens_, expected, file_.size(),
        file_.size() < expected ? "truncated" : "longer than its count"));
  }
  if (num_tokens_ != shard.num_tokens()) {
    throw fail(fmt::format("it holds targets for {} tokens, but its shard {} has {}", num_tokens_,
                           shard.path().string(), shard.num_tokens()));
  }
  uint64_t hash = 0;
  std::memcpy(&hash, &header[3], sizeof(hash));
  if (hash != shard.token_hash()) {
    throw fail(fmt::format(
        "it was made for other tokens than those of {} (the token hash it records differs): "
        "prepare the corpus again with mlprep",
        shard.path().string()));
  }
  file_.advise_sequential();
  size_t bad = 0;
  file_.read_in_place(kShardHeaderBytes, static_cast<size_t>(num_tokens_),
                      [&](const unsigned char* targets) {
                        bad = first_non_flag(targets, static_cast<size_t>(num_tokens_));
                      });
  if (bad != static_cast<size_t>(num_tokens_)) {
    uint8_t value = 0;
    file_.copy(kShardHeaderBytes + bad, 1, &value);
    throw fail(fmt::format("offset {}: {} (token {}) is not a target flag (0 or 1)",
                           kShardHeaderBytes + static_cast<int64_t>(bad), value, bad));
  }
  file_.advise_random();
}

std::vector<int32_t> LossMaskReader::targets_per_window(int64_t seq_len, int64_t windows) const {
  std::vector<int32_t> counts(static_cast<size_t>(windows));
  file_.read_in_place(kShardHeaderBytes, static_cast<size_t>(num_tokens_),
                      [&](const unsigned char* targets) {
                        for (int64_t w = 0; w < windows; ++w) {
                          const unsigned char* first = targets + w * seq_len + 1;
                          counts[static_cast<size_t>(w)] =
                              static_cast<int32_t>(std::count(first, first + seq_len, 1));
                        }
                      });
  return counts;
}

void LossMaskReader::read(int64_t start, std::span<uint8_t> out) const {
  file_.copy(kShardHeaderBytes + start, out.size(), out.data());
  // Opening checked every byte; one that is not a flag now was written since, where the file's
  // times did not tell.
  if (first_non_flag(out.data(), out.size()) != out.size()) file_.fail_changed("");
}

}  // namespace mltrain
