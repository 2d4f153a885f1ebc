#include "data/token_windows.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <numeric>

#include "common/error.h"
#include "data/corpus_description.h"
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

// A corpus that says it has loss masks must have each; a shard of a corpus without any has every
// target count. Each window's count of targets is taken once; the summary counts the targets and
// the documents longer than a window.
TEST(TokenWindows, LossMasksAreReadWhereTheCorpusSaysTheyAre) {
  TemporaryDirectory dir;
  std::filesystem::create_directories(dir / "chat");
  std::filesystem::create_directories(dir / "plain");
  // Documents of 5 and 30 tokens, each ended by token 2; the first half of each is a target.
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> targets;
  for (int document = 0; document < 20; ++document) {
    const int length = document % 2 == 0 ? 5 : 30;
    for (int i = 0; i < length; ++i) {
      tokens.push_back(i + 1 == length ? 2 : 10 + i);
      targets.push_back(2 * i < length ? 1 : 0);
    }
  }
  ShardSeriesWriter chat(dir / "chat", "train", 4096, 100'000, /*with_loss_masks=*/true);
  chat.append(tokens, targets);
  chat.finish();
  write_corpus_description(dir / "chat",
                           {.chat_template = ChatTemplate::chatml, .loss_masks = true});
  write_shard(dir / "plain" / "train_000000.bin", tokens, 4096);

  const TokenWindows masked((dir / "chat" / "train_*.bin").string(), 16, 4096);
  ASSERT_TRUE(masked.has_loss_masks());
  std::array<uint8_t, 16> read{};
  masked.read_targets(2, read);
  EXPECT_TRUE(std::equal(read.begin(), read.end(), targets.begin() + 2 * 16 + 1));
  for (int64_t w = 0; w < masked.num_windows(); ++w) {
    const auto first = targets.begin() + w * 16 + 1;
    EXPECT_EQ(masked.targets_in_window(w), std::count(first, first + 16, uint8_t{1})) << w;
  }
  const TokenWindows::LossMaskSummary summary = masked.loss_mask_summary(/*end_of_document=*/2);
  EXPECT_EQ(summary.tokens, 350);
  EXPECT_EQ(summary.targets, std::count(targets.begin(), targets.end(), uint8_t{1}));
  EXPECT_EQ(summary.documents, 20);
  EXPECT_EQ(summary.documents_cut, 10);  // the 30-token ones, longer than a window of 17

  const TokenWindows plain((dir / "plain" / "train_*.bin").string(), 16, 4096);
  EXPECT_FALSE(plain.has_loss_masks());
  plain.read_targets(2, read);
  EXPECT_EQ(std::count(read.begin(), read.end(), uint8_t{1}), 16);
  EXPECT_EQ(plain.targets_in_window(2), 16);

  // A description that is not one mlprep writes is named with what is wrong in it.
  const std::string good = testing::read_text(dir / "chat" / "corpus.json");
  for (const auto& [text, problem] :
       {std::pair{R"({"loss_masks": "yes"})", "type must be boolean"},
        std::pair{R"({"chat_template": "chatml"})", "loss_masks"},
        std::pair{R"({"loss_masks": true, "chat_template": "alpaca"})",
                  "unknown chat template alpaca"}}) {
    testing::write_text(dir / "chat" / "corpus.json", text);
    const std::string error = windows_error((dir / "chat" / "train_*.bin").string(), 16);
    EXPECT_CONTAINS(error, "corpus.json: not a corpus description that mlprep writes");
    EXPECT_CONTAINS(error, problem);
  }
  testing::write_text(dir / "chat" / "corpus.json", good);

  std::filesystem::remove(dir / "chat" / "train_000000.mask");
  EXPECT_CONTAINS(windows_error((dir / "chat" / "train_*.bin").string(), 16),
                  "train_000000.mask: missing: its corpus has loss masks");
}

// A corpus of more than 2^31 tokens: two sparse uint16 shards of 1.1 billion tokens each, whose
// last window carries two marks. Every offset on the way is 64-bit.
TEST(TokenWindows, CorporaOverTwoToTheThirtyOneTokensWork) {
  TemporaryDirectory dir;
  constexpr int64_t kTokens = 1'100'000'001;
  for (const char* name : {"train_000000.bin", "train_000001.bin"}) {
    std::array<int32_t, 256> header{};
    header[0] = kShardMagicU16;
    header[1] = kShardVersionU16;
    header[2] = static_cast<int32_t>(kTokens);
    const int fd = ::open((dir / name).c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, header.data(), sizeof(header), 0), static_cast<ssize_t>(sizeof(header)));
    const uint16_t marks[2] = {77, 99};
    ASSERT_EQ(::pwrite(fd, marks, sizeof(marks), kShardHeaderBytes + (kTokens - 2) * 2),
              static_cast<ssize_t>(sizeof(marks)));
    ::close(fd);
  }
  constexpr int64_t kSeqLen = 1'000'000;  // 1,100 windows a shard, the last ending on the marks
  const TokenWindows windows((dir / "train_*.bin").string(), kSeqLen, 100);
  EXPECT_EQ(windows.num_tokens(), 2 * kTokens);
  EXPECT_GT(windows.num_tokens(), int64_t{1} << 31);
  ASSERT_EQ(windows.num_windows(), 2200);
  std::vector<int64_t> last(kSeqLen + 1);
  windows.read(2199, last);
  EXPECT_EQ(last[kSeqLen - 1], 77);
  EXPECT_EQ(last[kSeqLen], 99);
  EXPECT_EQ(last[0], 0);
}

}  // namespace
}  // namespace mltrain
