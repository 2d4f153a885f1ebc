#include "data/shard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/mapping_read_guard.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// A shard written by hand from llm.c's documented layout, not by write_shard.
template <class Token>
void write_llmc_shard(const std::filesystem::path& path, int32_t magic, int32_t version,
                      const std::vector<Token>& tokens, int64_t count_in_header) {
  std::array<int32_t, 256> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count_in_header);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(Token));
}

std::vector<int64_t> read_all(const ShardReader& shard) {
  std::vector<int64_t> tokens(shard.num_tokens());
  shard.read(0, tokens);
  return tokens;
}

std::string open_error(const std::filesystem::path& path, int64_t vocab_size = 70000) {
  try {
    ShardReader shard(path, vocab_size);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(Shard, ReadsShardsWrittenFromTheLlmcLayout) {
  TemporaryDirectory dir;
  const std::vector<uint16_t> narrow = {0, 1, 65535, 42, 7};
  write_llmc_shard(dir / "u16.bin", 20240520, 1, narrow, 5);
  const std::vector<uint32_t> wide = {0, 65536, 99999, 3};
  write_llmc_shard(dir / "u32.bin", 20240801, 7, wide, 4);

  const ShardReader u16(dir / "u16.bin", 65536);
  EXPECT_EQ(u16.token_bytes(), 2);
  EXPECT_EQ(read_all(u16), (std::vector<int64_t>{0, 1, 65535, 42, 7}));
  const ShardReader u32(dir / "u32.bin", 100000);
  EXPECT_EQ(u32.token_bytes(), 4);
  EXPECT_EQ(read_all(u32), (std::vector<int64_t>{0, 65536, 99999, 3}));
  std::vector<int64_t> middle(2);
  u32.read(1, middle);
  EXPECT_EQ(middle, (std::vector<int64_t>{65536, 99999}));
}

TEST(Shard, WriterPicksTheNarrowestTypeAndRoundTrips) {
  TemporaryDirectory dir;
  std::vector<uint32_t> tokens(1000);
  std::iota(tokens.begin(), tokens.end(), 0);
  write_shard(dir / "small.bin", tokens, 4096);
  EXPECT_EQ(std::filesystem::file_size(dir / "small.bin"), 1024 + 1000 * 2u);
  const ShardReader small(dir / "small.bin", 4096);
  EXPECT_EQ(small.token_bytes(), 2);
  EXPECT_EQ(read_all(small), std::vector<int64_t>(tokens.begin(), tokens.end()));

  tokens[500] = 70000;
  write_shard(dir / "large.bin", tokens, 70001);
  EXPECT_EQ(std::filesystem::file_size(dir / "large.bin"), 1024 + 1000 * 4u);
  const ShardReader large(dir / "large.bin", 70001);
  EXPECT_EQ(large.token_bytes(), 4);
  EXPECT_EQ(read_all(large), std::vector<int64_t>(tokens.begin(), tokens.end()));

  // The header, read back as plain int32s.
  std::array<int32_t, 3> header{};
  std::ifstream(dir / "large.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(header.data()), 12);
  EXPECT_EQ(header, (std::array<int32_t, 3>{20240801, 7, 1000}));
}

// Tokens appended in uneven pieces come out cut at the shard size, each shard whole, across the
// writer's internal blocks of 2^18 tokens too.
TEST(Shard, SeriesWriterCutsShardsAtTheirSize) {
  TemporaryDirectory dir;
  std::vector<uint32_t> tokens(700'000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 31) % 5000);
  ShardSeriesWriter writer(dir.path(), "train", 5000, /*shard_tokens=*/300'000);
  size_t start = 0;
  for (size_t piece = 1; start < tokens.size(); piece = piece * 3 + 1) {
    const size_t taken = std::min(piece, tokens.size() - start);
    writer.append(std::span<const uint32_t>(tokens).subspan(start, taken));
    start += taken;
    EXPECT_EQ(writer.num_tokens(), static_cast<int64_t>(start));
  }
  // Before finish() the last, partial shard is not there under its name.
  EXPECT_TRUE(std::filesystem::exists(dir / "train_000001.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "train_000002.bin"));
  EXPECT_EQ(writer.finish(), 3);
  std::vector<int64_t> all;
  for (const auto& [name, size] : {std::pair{"train_000000.bin", 300'000},
                                   {"train_000001.bin", 300'000},
                                   {"train_000002.bin", 100'000}}) {
    const ShardReader shard(dir / name, 5000);
    EXPECT_EQ(shard.num_tokens(), size) << name;
    const std::vector<int64_t> read = read_all(shard);
    all.insert(all.end(), read.begin(), read.end());
  }
  EXPECT_EQ(all, std::vector<int64_t>(tokens.begin(), tokens.end()));
}

// A writer that ends without finish(), as when a run is interrupted, leaves its complete shards
// and no partial one.
TEST(Shard, AnAbandonedSeriesLeavesOnlyCompleteShards) {
  TemporaryDirectory dir;
  {
    ShardSeriesWriter writer(dir.path(), "val", 100, /*shard_tokens=*/10);
    const std::vector<uint32_t> tokens(25, 7);
    writer.append(tokens);
  }
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"val_000000.bin", "val_000001.bin"}));
  EXPECT_EQ(ShardReader(dir / "val_000001.bin", 100).num_tokens(), 10);
}

TEST(Shard, DamagedShardsNameTheFileAndTheProblem) {
  TemporaryDirectory dir;
  const std::vector<uint16_t> tokens = {1, 2, 3, 4};
  write_llmc_shard(dir / "magic.bin", 12345, 1, tokens, 4);
  EXPECT_CONTAINS(open_error(dir / "magic.bin"),
                  "magic.bin: offset 0: magic 12345 is not a token shard's");
  write_llmc_shard(dir / "version.bin", 20240520, 3, tokens, 4);
  EXPECT_CONTAINS(open_error(dir / "version.bin"), "version.bin: offset 4: unknown version 3");
  write_llmc_shard(dir / "truncated.bin", 20240520, 1, tokens, 5);
  EXPECT_CONTAINS(open_error(dir / "truncated.bin"),
                  "truncated.bin: offset 8: the header counts 5 tokens");
  EXPECT_CONTAINS(open_error(dir / "truncated.bin"), "(truncated)");
  write_llmc_shard(dir / "long.bin", 20240520, 1, tokens, 3);
  EXPECT_CONTAINS(open_error(dir / "long.bin"), "(longer than its count)");
  std::ofstream(dir / "tiny.bin") << "abc";
  EXPECT_CONTAINS(open_error(dir / "tiny.bin"),
                  "tiny.bin: 3 bytes is shorter than the 1024-byte shard header");
  EXPECT_CONTAINS(open_error(dir / "absent.bin"),
                  "absent.bin: cannot open the token shard: no such file");
  // A named pipe is refused at once, not waited on for a writer.
  ASSERT_EQ(::mkfifo((dir / "pipe.bin").c_str(), 0644), 0);
  EXPECT_CONTAINS(open_error(dir / "pipe.bin"), "pipe.bin: the token shard is a named pipe");
  std::filesystem::create_directory(dir / "directory.bin");
  EXPECT_CONTAINS(open_error(dir / "directory.bin"),
                  "directory.bin: the token shard is a directory");
}

// The message of the runtime error that reading all of `shard` raises ("" when it reads).
std::string read_error(const ShardReader& shard) {
  try {
    read_all(shard);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

// A shard may not change under a run that reads it: each way it can is named, and none crashes.
TEST(Shard, AShardThatChangesUnderItsReaderIsNamedWithTheChange) {
  TemporaryDirectory dir;
  const std::vector<uint32_t> tokens(100'000, 5);
  const auto an_hour_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(1);
  const std::vector<std::string> names = {"truncated.bin", "replaced.bin", "written.bin",
                                          "forged.bin", "removed.bin"};
  std::vector<ShardReader> shards;
  for (const std::string& name : names) {
    write_shard(dir / name, tokens, 100);
    // So that a write now is seen as one, however coarse the clock of file times.
    std::filesystem::last_write_time(dir / name, an_hour_ago);
    shards.emplace_back(dir / name, 100);
    EXPECT_EQ(read_error(shards.back()), "");
  }
  const auto write_token = [&](const std::string& name, const char* token) {
    std::fstream out(dir / name, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(1024 + 4 * 500);
    out.write(token, 2);
  };
  std::filesystem::resize_file(dir / "truncated.bin", 2000);
  write_shard(dir / "new.bin", tokens, 100);
  std::filesystem::rename(dir / "new.bin", dir / "replaced.bin");
  write_token("written.bin", "\x07\x00");
  // Written with its modification time put back: its change time, which no one can set, tells.
  write_token("forged.bin", "\xff\x00");
  std::filesystem::last_write_time(dir / "forged.bin", an_hour_ago);
  std::filesystem::remove(dir / "removed.bin");

  const std::vector<std::string> changes = {
      "it was 201024 bytes and is now 2000 (truncated)", "another file was put in its place",
      "it was written to", "it was written to", "it was removed"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string message = read_error(shards[i]);
    EXPECT_CONTAINS(message, names[i] + ": the token shard changed while mltrain read it");
    EXPECT_CONTAINS(message, changes[i]);
  }
}

// A mapped file that shrinks raises SIGBUS where its pages are gone. Under the guard the read ends
// on zeros and says so; outside it the signal keeps its default action, a crash.
TEST(MappingReadGuard, ATruncatedMappingReadsZerosAndSaysSo) {
  TemporaryDirectory dir;
  const size_t bytes = 1 << 20;
  testing::write_text(dir / "file", std::string(bytes, '\x01'));
  const int fd = ::open((dir / "file").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* mapping = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(mapping, MAP_FAILED);
  const auto* data = static_cast<const unsigned char*>(mapping);
  std::filesystem::resize_file(dir / "file", 4096);
  int64_t sum = 0;
  {
    const MappingReadGuard guard(data, bytes);
    for (size_t i = 0; i < bytes; ++i) sum += data[i];
    EXPECT_TRUE(guard.faulted());
  }
  EXPECT_EQ(sum, 4096) << "the page that is left, then zeros";
  {
    const MappingReadGuard guard(data, 4096);
    EXPECT_EQ(data[0], 1);
    EXPECT_FALSE(guard.faulted());
  }
  ::munmap(mapping, bytes);

  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const int again = ::open((dir / "file").c_str(), O_RDONLY);
        const auto* unguarded = static_cast<const volatile unsigned char*>(
            ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, again, 0));
        std::exit(unguarded[bytes - 1]);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(Shard, OutOfRangeTokenNamesItsOffset) {
  TemporaryDirectory dir;
  const std::vector<uint16_t> tokens = {1, 2, 4096, 4};
  write_llmc_shard(dir / "ids.bin", 20240520, 1, tokens, 4);
  const std::string message = open_error(dir / "ids.bin", 4096);
  EXPECT_CONTAINS(
      message, "ids.bin: offset 1028: token 4096 (index 2) is not below the vocabulary size 4096");
  EXPECT_EQ(open_error(dir / "ids.bin", 4097), "");
}

// A sparse uint32 shard past 4 GiB: offsets beyond 32 bits must read the right tokens.
TEST(Shard, ShardsOverFourGibibytesWork) {
  TemporaryDirectory dir;
  const int64_t count = 1'100'000'000;  // 4.4 GB of uint32 tokens
  const auto path = dir / "huge.bin";
  {
    std::array<int32_t, 256> header{};
    header[0] = 20240801;
    header[1] = 7;
    header[2] = static_cast<int32_t>(count);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, header.data(), sizeof(header), 0), static_cast<ssize_t>(sizeof(header)));
    const uint32_t marks[2] = {77, 99};
    ASSERT_EQ(::pwrite(fd, marks, sizeof(marks), 1024 + (count - 2) * 4),
              static_cast<ssize_t>(sizeof(marks)));
    ::close(fd);
  }
  const ShardReader shard(path, 100);
  EXPECT_EQ(shard.num_tokens(), count);
  std::vector<int64_t> tail(3);
  shard.read(count - 3, tail);
  EXPECT_EQ(tail, (std::vector<int64_t>{0, 77, 99}));
}

}  // namespace
}  // namespace mltrain
