// Loss masks beside token shards: written with their shards, cut where they are, and read back
// only where they belong to their shard, whole and unchanged.
#include "data/loss_mask.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "common/error.h"
#include "data/shard.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// The UserError or runtime error opening (or reading) a mask gives; empty when there is none.
std::string open_error(const std::filesystem::path& mask, const ShardReader& shard) {
  try {
    LossMaskReader reader(mask, shard);
    std::vector<uint8_t> all(static_cast<size_t>(reader.num_tokens()));
    reader.read(0, all);
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

void write_bytes_at(const std::filesystem::path& path, std::streamoff offset,
                    const std::string& bytes) {
  std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
  out.seekp(offset);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 25 tokens with their flags, in shards of 10: three shards and three masks, cut alike. Returns
// the flags.
std::vector<uint8_t> write_series(const std::filesystem::path& directory) {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> targets;
  for (uint32_t i = 0; i < 25; ++i) {
    tokens.push_back(i * 7 % 50);
    targets.push_back(i % 3 == 0 ? 1 : 0);
  }
  ShardSeriesWriter series(directory, "train", 50, 10, /*with_loss_masks=*/true);
  // In pieces that straddle the cuts.
  series.append(std::span(tokens).first(7), std::span(targets).first(7));
  series.append(std::span(tokens).subspan(7), std::span(targets).subspan(7));
  EXPECT_EQ(series.finish(), 3);
  return targets;
}

TEST(LossMask, MasksAreWrittenBesideTheirShardsCutAlikeAndReadBack) {
  TemporaryDirectory dir;
  const std::vector<uint8_t> targets = write_series(dir.path());
  for (int shard = 0; shard < 3; ++shard) {
    const std::filesystem::path bin = dir / fmt::format("train_{:06d}.bin", shard);
    ASSERT_EQ(loss_mask_path(bin), dir / fmt::format("train_{:06d}.mask", shard));
    const ShardReader tokens_reader(bin, 50);
    const LossMaskReader mask(loss_mask_path(bin), tokens_reader);
    ASSERT_EQ(mask.num_tokens(), tokens_reader.num_tokens());
    std::vector<uint8_t> read(static_cast<size_t>(mask.num_tokens()));
    mask.read(0, read);
    const auto first = targets.begin() + shard * 10;
    EXPECT_EQ(read, std::vector<uint8_t>(first, first + static_cast<ptrdiff_t>(read.size())));
    // The file: the 1,024-byte header, then one byte a token.
    EXPECT_EQ(std::filesystem::file_size(loss_mask_path(bin)), 1024 + read.size());
  }
}

TEST(LossMask, AMaskThatIsNotItsShardsIsRefusedNamingTheFileAndTheProblem) {
  TemporaryDirectory dir;
  write_series(dir.path());
  const ShardReader first(dir / "train_000000.bin", 50);
  const ShardReader second(dir / "train_000001.bin", 50);
  const ShardReader last(dir / "train_000002.bin", 50);  // 5 tokens

  // Another shard's mask of the same length: its token hash differs.
  EXPECT_CONTAINS(open_error(dir / "train_000001.mask", first),
                  "train_000001.mask: it was made for other tokens than those of");
  EXPECT_CONTAINS(open_error(dir / "train_000000.mask", last),
                  "train_000000.mask: it holds targets for 10 tokens, but its shard");
  // A byte that is no flag, named by its offset.
  std::filesystem::copy_file(dir / "train_000000.mask", dir / "flag.mask");
  write_bytes_at(dir / "flag.mask", 1024 + 4, "\x02");
  EXPECT_CONTAINS(open_error(dir / "flag.mask", first),
                  "flag.mask: offset 1028: 2 (token 4) is not a target flag (0 or 1)");
  std::filesystem::copy_file(dir / "train_000000.mask", dir / "short.mask");
  std::filesystem::resize_file(dir / "short.mask", 1024 + 9);
  EXPECT_CONTAINS(open_error(dir / "short.mask", first),
                  "short.mask: offset 8: the header counts 10 tokens (1034 bytes in all) but the "
                  "file has 1033 bytes (truncated)");
  EXPECT_CONTAINS(open_error(dir / "train_000000.bin", first),
                  "train_000000.bin: offset 0: magic 20240520 is not a loss mask's (20261207)");
  EXPECT_CONTAINS(open_error(dir / "none.mask", first), "none.mask");
  EXPECT_EQ(open_error(dir / "train_000000.mask", first), "");
}

TEST(LossMask, AMaskThatChangesUnderItsReaderIsNamedWithTheChange) {
  TemporaryDirectory dir;
  write_series(dir.path());
  const ShardReader shard(dir / "train_000000.bin", 50);
  const auto an_hour_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(1);
  std::filesystem::last_write_time(dir / "train_000000.mask", an_hour_ago);
  const LossMaskReader mask(dir / "train_000000.mask", shard);
  write_bytes_at(dir / "train_000000.mask", 1024, "\x01");
  std::vector<uint8_t> read(10);
  try {
    mask.read(0, read);
    FAIL() << "a changed mask was read";
  } catch (const std::runtime_error& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "train_000000.mask: the loss mask changed while mltrain read it (it was "
                    "written to)");
  }
}

}  // namespace
}  // namespace mltrain
