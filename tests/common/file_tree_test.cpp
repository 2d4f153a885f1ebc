#include "common/file_tree.h"

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::read_text;
using testing::TemporaryDirectory;
using testing::write_text;

bool present(const std::filesystem::path& path) {
  return std::filesystem::exists(std::filesystem::symlink_status(path));
}

TEST(RemoveTree, RemovesADirectoryAndEverythingBelowIt) {
  TemporaryDirectory dir;
  const auto tree = dir / "checkpoint";
  std::filesystem::create_directories(tree / "a" / "b" / "empty");
  write_text(tree / "top.bin", "1");
  write_text(tree / "a" / "middle.bin", "2");
  write_text(tree / "a" / "b" / "deep.bin", "3");
  write_text(dir / "beside.bin", "kept");
  remove_tree(tree);
  EXPECT_FALSE(present(tree));
  EXPECT_EQ(read_text(dir / "beside.bin"), "kept");
}

TEST(RemoveTree, RemovesLinksWithoutFollowingThem) {
  TemporaryDirectory dir;
  std::filesystem::create_directories(dir / "elsewhere");
  write_text(dir / "elsewhere" / "precious.bin", "kept");
  std::filesystem::create_directories(dir / "tree");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "tree" / "link");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "top_link");
  std::filesystem::create_symlink(dir / "nowhere", dir / "tree" / "dangling");
  remove_tree(dir / "tree");
  remove_tree(dir / "top_link");
  EXPECT_FALSE(present(dir / "tree"));
  EXPECT_FALSE(present(dir / "top_link"));
  EXPECT_EQ(read_text(dir / "elsewhere" / "precious.bin"), "kept");
}

TEST(RemoveTree, RemovesAPlainFile) {
  TemporaryDirectory dir;
  write_text(dir / "file.bin", "x");
  remove_tree(dir / "file.bin");
  EXPECT_FALSE(present(dir / "file.bin"));
}

TEST(RemoveTree, APathThatIsNotThereIsNoError) {
  TemporaryDirectory dir;
  std::error_code error = std::make_error_code(std::errc::io_error);
  remove_tree(dir / "never_made", error);
  EXPECT_FALSE(error) << error.message();
  EXPECT_NO_THROW(remove_tree(dir / "never_made"));
}

// A path through a file cannot be walked: reported, not ignored (root passes permission checks,
// so this is the failure a test run as root can make).
TEST(RemoveTree, AFailureIsReportedWithThePath) {
  TemporaryDirectory dir;
  write_text(dir / "file.bin", "x");
  const auto through_a_file = dir / "file.bin" / "child";
  std::error_code error;
  remove_tree(through_a_file, error);
  EXPECT_EQ(error, std::errc::not_a_directory);
  try {
    remove_tree(through_a_file);
    FAIL() << "no exception";
  } catch (const std::filesystem::filesystem_error& thrown) {
    EXPECT_EQ(thrown.path1(), through_a_file);
    EXPECT_EQ(thrown.code(), std::errc::not_a_directory);
  }
  EXPECT_EQ(read_text(dir / "file.bin"), "x");
}

}  // namespace
}  // namespace mltrain
