#include "data/line_reader.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

std::vector<std::string> all_lines(LineReader& reader) {
  std::vector<std::string> lines;
  for (std::string line; reader.next(line);) lines.push_back(line);
  return lines;
}

// Compresses `file` with a command-line tool (gzip or zstd) into `compressed`.
void compress(const std::string& tool, const std::filesystem::path& file,
              const std::filesystem::path& compressed) {
  const auto result =
      testing::run_command(tool + " -c " + file.string() + " > " + compressed.string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

TEST(LineReader, ReadsPlainGzipAndZstdFilesAlikeWhateverTheirNames) {
  TemporaryDirectory dir;
  std::string text;
  std::vector<std::string> expected;
  for (int i = 0; i < 50'000; ++i) {
    expected.push_back("line " + std::to_string(i) + (i % 7 == 0 ? " 中文" : ""));
    text += expected.back() + "\n";
  }
  expected.push_back("a last line without a newline");
  text += expected.back();
  testing::write_text(dir / "plain", text);
  compress("gzip", dir / "plain", dir / "gzip_without_suffix");
  compress("zstd", dir / "plain", dir / "zstd_without_suffix");
  // Two gzip members one after the other, as `cat a.gz b.gz` makes: one stream.
  testing::write_text(dir / "half1", text.substr(0, 1000));
  testing::write_text(dir / "half2", text.substr(1000));
  compress("gzip", dir / "half1", dir / "1.gz");
  compress("gzip", dir / "half2", dir / "2.gz");
  testing::write_text(dir / "members.gz",
                      testing::read_text(dir / "1.gz") + testing::read_text(dir / "2.gz"));

  for (const auto& [name, compression] : {std::pair{"plain", Compression::kNone},
                                          {"gzip_without_suffix", Compression::kGzip},
                                          {"zstd_without_suffix", Compression::kZstd},
                                          {"members.gz", Compression::kGzip}}) {
    LineReader reader(dir / name);
    EXPECT_EQ(reader.compression(), compression) << name;
    EXPECT_EQ(all_lines(reader), expected) << name;
    EXPECT_EQ(reader.consumed(), static_cast<int64_t>(std::filesystem::file_size(dir / name)))
        << name;
  }
}

TEST(LineReader, ALineLongerThanTheBufferComesWhole) {
  TemporaryDirectory dir;
  const std::string long_line(3'000'000, 'x');
  testing::write_text(dir / "long", "short\n" + long_line + "\nend\n");
  LineReader reader(dir / "long");
  EXPECT_EQ(all_lines(reader), (std::vector<std::string>{"short", long_line, "end"}));
}

TEST(LineReader, DamagedDataAndUnreadableFilesNameTheFile) {
  TemporaryDirectory dir;
  std::string text;
  for (int i = 0; i < 20'000; ++i) text += "some text to compress " + std::to_string(i) + "\n";
  testing::write_text(dir / "plain", text);
  compress("gzip", dir / "plain", dir / "whole.gz");
  compress("zstd", dir / "plain", dir / "whole.zst");
  for (const char* name : {"whole.gz", "whole.zst"}) {
    const std::string bytes = testing::read_text(dir / name);
    const std::string cut = std::string("cut_") + name;
    testing::write_text(dir / cut, bytes.substr(0, bytes.size() / 2));
    try {
      LineReader reader(dir / cut);
      all_lines(reader);
      FAIL() << cut << " read to its end";
    } catch (const UserError& error) {
      EXPECT_CONTAINS(std::string(error.what()), cut + ": damaged");
    }
  }
  try {
    LineReader reader(dir / "absent");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "absent: cannot read the input file");
  }
}

}  // namespace
}  // namespace mltrain
