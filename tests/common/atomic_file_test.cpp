#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::read_text;
using testing::TemporaryDirectory;
using testing::write_text;

size_t entries_in(const std::filesystem::path& directory) {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory)) ++count;
  return count;
}

TEST(AtomicFileWriter, TargetAppearsWholeOnlyAtCommit) {
  TemporaryDirectory dir;
  const auto target = dir / "file.bin";
  AtomicFileWriter writer(target);
  writer.write("hello ");
  writer.write("world");
  EXPECT_FALSE(std::filesystem::exists(target));
  writer.commit();
  EXPECT_EQ(read_text(target), "hello world");
  EXPECT_EQ(entries_in(dir.path()), 1u) << "the temporary file must be gone";
}

TEST(AtomicFileWriter, AbandonedWriteLeavesTheOldFileAlone) {
  TemporaryDirectory dir;
  const auto target = dir / "file.bin";
  write_text(target, "saved before");
  {
    AtomicFileWriter writer(target);
    writer.write("half of a new vers");
  }  // no commit: as when an exception unwinds a save
  EXPECT_EQ(read_text(target), "saved before");
  EXPECT_EQ(entries_in(dir.path()), 1u);
}

TEST(AtomicFileWriter, UncreatableFileNamesThePath) {
  TemporaryDirectory dir;
  const auto target = dir / "missing-directory" / "file.bin";
  try {
    AtomicFileWriter writer(target);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("missing-directory"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace mltrain
