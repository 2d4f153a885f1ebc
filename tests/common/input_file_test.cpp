// What a path names when it is not a file to read, and what the error policy makes of failures.
#include "common/input_file.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "common/error.h"
#include "common/guarded_main.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// The UserError that opening `path` as a "config file" raises ("" when it opens).
std::string open_error(const std::filesystem::path& path) {
  try {
    InputFile(path, "config file");
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

// A named pipe without a writer would block an open for ever; InputFile must return at once,
// which this test does by finishing at all.
TEST(InputFile, RefusesWhatIsNoFileToReadAndSaysWhatItIs) {
  TemporaryDirectory dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0644), 0);
  std::filesystem::create_directory(dir / "directory");
  EXPECT_CONTAINS(open_error(dir / "pipe"), "pipe: the config file is a named pipe (FIFO)");
  EXPECT_CONTAINS(open_error(dir / "directory"), "directory: the config file is a directory");
  EXPECT_CONTAINS(open_error("/dev/zero"), "/dev/zero: the config file is a character device");
  EXPECT_CONTAINS(open_error(dir / "absent"), "absent: cannot open the config file: no such file");
  testing::write_text(dir / "file", "text");
  EXPECT_EQ(open_error(dir / "file"), "");
  // A socket cannot be opened at all: it is named for what it is all the same.
  const int listening = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, (dir / "socket").c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(listening, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_CONTAINS(open_error(dir / "socket"), "socket: the config file is a socket");
  ::close(listening);
  // Through a link, what it points to counts.
  std::filesystem::create_symlink(dir / "pipe", dir / "link");
  EXPECT_CONTAINS(open_error(dir / "link"), "a named pipe (FIFO)");
}

TEST(InputFile, ReadsWholeFilesWithinALimitAndNamesATruncation) {
  TemporaryDirectory dir;
  testing::write_text(dir / "file", std::string(200'000, 'x'));
  const InputFile file(dir / "file", "metrics file");
  EXPECT_EQ(file.size(), 200'000u);
  EXPECT_EQ(file.read_all(1 << 20).size(), 200'000u);
  EXPECT_THROW(file.read_all(100'000), UserError);
  char bytes[10];
  file.read_at(199'990, bytes, sizeof(bytes));
  try {
    file.read_at(199'995, bytes, sizeof(bytes));
    ADD_FAILURE() << "a read past the end must fail";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "file: the metrics file ends before byte 200005");
  }
  // Files of the kernel report no size and are read to their end.
  EXPECT_CONTAINS(read_text_file("/proc/self/status", "kernel file"), "Pid:");
}

TEST(GuardedMain, APathMltrainMayNotWriteIsTheUsersToFixAndStacksAreNotShown) {
  const auto failing_with = [](int error) {
    return guarded_main([error]() -> int {
      throw std::filesystem::filesystem_error("cannot create", "/runs/x",
                                              std::error_code(error, std::generic_category()));
    });
  };
  EXPECT_EQ(failing_with(EACCES), kExitUserError);
  EXPECT_EQ(failing_with(EROFS), kExitUserError);
  EXPECT_EQ(failing_with(ENOSPC), kExitRuntimeFailure);
  EXPECT_EQ(guarded_main([]() -> int { throw UserError("bad"); }), kExitUserError);
  // LibTorch's errors carry their C++ stack after the first line: only the reason is shown.
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(
      guarded_main([]() -> int { throw std::runtime_error("the reason\nframe #0: a stack"); }),
      kExitRuntimeFailure);
  const std::string logged =
      ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(logged, "the reason");
  EXPECT_EQ(logged.find("frame #0"), std::string::npos) << logged;
  EXPECT_EQ(guarded_main([] { return 0; }), 0);
}

}  // namespace
}  // namespace mltrain
