// DirectoryLock's refusals of what stands where the directory or its lock file should: each names
// the setting, the path in the way and what to do, not a raw system error about the directory.
#include "common/directory_lock.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

const DirectoryLock::Names kRunNames = {.lock_file = "run.lock",
                                        .owner = "training run",
                                        .setting = "train.run_dir",
                                        .keep_lock_file = true};

// The UserError that taking `directory` for a training run gives; empty where it is taken.
std::string refusal(const std::filesystem::path& directory) {
  try {
    const DirectoryLock lock(directory, kRunNames);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(DirectoryLock, SomethingInTheLockFilesPlaceIsNamedNotTheDirectory) {
  TemporaryDirectory dir;
  const auto run = dir / "run";
  const auto lock = run / "run.lock";
  const auto expect_named = [&](const std::string& what) {
    const std::string message = refusal(run);
    EXPECT_CONTAINS(message, "train.run_dir " + run.string() + ": " + lock.string() + " is " +
                                 what +
                                 ", where the training run keeps its lock file: move it away");
    EXPECT_EQ(message.find("cannot write there"), std::string::npos) << message;
  };
  std::filesystem::create_directories(lock);
  expect_named("a directory");
  std::filesystem::remove(lock);
  std::filesystem::create_symlink(dir / "elsewhere", lock);
  expect_named("a symbolic link");
  std::filesystem::remove(lock);
  ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0);
  expect_named("a named pipe");
  std::filesystem::remove(lock);
  EXPECT_EQ(refusal(run), "");  // with the way clear, the directory is taken
}

TEST(DirectoryLock, AFileInTheDirectorysPlaceSaysWhatToDo) {
  TemporaryDirectory dir;
  testing::write_text(dir / "run", "a file");
  EXPECT_EQ(refusal(dir / "run"), "train.run_dir " + (dir / "run").string() +
                                      " is a file, not a directory: give a directory, or move it "
                                      "away");
}

}  // namespace
}  // namespace mltrain
