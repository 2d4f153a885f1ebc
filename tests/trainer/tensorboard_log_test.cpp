// TensorBoardLog's event files, read back by the tensorboard package's own loader
// (tests/reference/tensorboard_read.py), and its CRC-32C against the published check value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/support/test_support.h"
#include "trainer/report/tensorboard_log.h"

namespace mltrain {
namespace {

// The scalars of the event files in `directory`, as tensorboard reads them: {tag: [[step, value]]}.
nlohmann::json read_with_tensorboard(const std::filesystem::path& directory) {
  const testing::CommandResult read = testing::run_command(
      std::string(MLTRAIN_PYTHON) + " " MLTRAIN_SOURCE_DIR "/tests/reference/tensorboard_read.py " +
      directory.string());
  if (read.exit_code != 0) throw std::runtime_error(read.output);
  return nlohmann::json::parse(read.output);
}

TEST(TensorBoardLog, Crc32cGivesThePublishedCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283U);  // RFC 3720, appendix B.4
  EXPECT_EQ(crc32c(""), 0U);
}

TEST(TensorBoardLog, TensorBoardReadsBackEveryScalarAtItsStep) {
  testing::TemporaryDirectory dir;
  {
    TensorBoardLog log(dir / "tensorboard");
    log.write(1, {{"train/loss", 3.25}, {"train/lr", 1e-3}});
    log.write(300, {{"train/loss", 2.5}, {"val/loss", 2.75}});
    log.write(int64_t{1} << 40, {{"train/loss", 1e-7}});  // a step past 32 bits
  }
  const nlohmann::json scalars = read_with_tensorboard(dir / "tensorboard");
  const nlohmann::json expected = {{"train/loss",
                                    {{1, static_cast<double>(3.25F)},
                                     {300, static_cast<double>(2.5F)},
                                     {int64_t{1} << 40, static_cast<double>(1e-7F)}}},
                                   {"train/lr", {{1, static_cast<double>(1e-3F)}}},
                                   {"val/loss", {{300, static_cast<double>(2.75F)}}}};
  EXPECT_EQ(scalars, expected) << scalars.dump();
}

// What stands where the event files go is said when the log is made, before the first step, with
// the key that asked for them and what to do, not as std::filesystem's text.
TEST(TensorBoardLog, SomethingInPlaceOfItsDirectoryIsAUserErrorNamingTheKey) {
  testing::TemporaryDirectory dir;
  const auto refusal = [](const std::filesystem::path& directory) -> std::string {
    try {
      const TensorBoardLog log(directory);
    } catch (const UserError& error) {
      return error.what();
    }
    return "";
  };
  testing::write_text(dir / "tensorboard", "not a directory");
  EXPECT_EQ(refusal(dir / "tensorboard"),
            "train.tensorboard: " + (dir / "tensorboard").string() +
                " is a file, where TensorBoard's event files go: move it away, or turn "
                "train.tensorboard off");
  std::filesystem::create_directory_symlink(dir / "nowhere", dir / "link");
  EXPECT_CONTAINS(refusal(dir / "link"),
                  (dir / "link").string() + " is a symbolic link to nothing");
  EXPECT_CONTAINS(refusal(dir / "tensorboard" / "below"),
                  "train.tensorboard: cannot write TensorBoard's event files in " +
                      (dir / "tensorboard" / "below").string());
}

}  // namespace
}  // namespace mltrain
