#include "data/token_windows.h"

#include <gtest/gtest.h>

#include <numeric>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

void write_counting_shard(const std::filesystem::path& path, uint32_t first, size_t count) {
  std::vector<uint32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  write_shard(path, tokens, 4096);
}

std::string windows_error(const std::string& pattern, int64_t seq_len) {
  try {
    TokenWindows windows(pattern, seq_len, 4096);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(TokenWindows, WindowsOverlapByOneTokenAndNeverCrossAShardEnd) {
  TemporaryDirectory dir;
  // Written out of order: the corpus order is the sorted file names.
  write_counting_shard(dir / "train_000001.bin", 1000, 50);
  write_counting_shard(dir / "train_000000.bin", 0, 100);
  const TokenWindows windows((dir / "train_*.bin").string(), 8, 4096);
  // floor((100 - 1) / 8) = 12 windows in the first shard, floor((50 - 1) / 8) = 6 in the second.
  ASSERT_EQ(windows.num_windows(), 18);
  EXPECT_EQ(windows.num_tokens(), 150);
  std::vector<int64_t> window(9);
  for (int64_t i = 0; i < 18; ++i) {
    windows.read(i, window);
    const int64_t first = i < 12 ? 8 * i : 1000 + 8 * (i - 12);
    for (int64_t t = 0; t < 9; ++t) ASSERT_EQ(window[t], first + t) << "window " << i;
  }
}

TEST(TokenWindows, BadInputsNameThePatternOrTheFile) {
  TemporaryDirectory dir;
  EXPECT_CONTAINS(windows_error((dir / "none_*.bin").string(), 8),
                  "no token shards match " + (dir / "none_*.bin").string());
  write_counting_shard(dir / "short_000000.bin", 0, 8);
  EXPECT_CONTAINS(
      windows_error((dir / "short_*.bin").string(), 8),
      "short_000000.bin: 8 tokens are fewer than one window of data.seq_len + 1 = 9 tokens");
  EXPECT_EQ(windows_error((dir / "short_*.bin").string(), 7), "");
}

}  // namespace
}  // namespace mltrain
