#include "trainer/run_directory_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "common/error.h"

namespace mltrain {
namespace {

constexpr const char* kLockName = "run.lock";

// Who holds the lock, as the holder writes it: one line.
std::string holder_line() {
  std::array<char, 256> host{};
  ::gethostname(host.data(), host.size() - 1);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::array<char, 32> started{};
  std::strftime(started.data(), started.size(), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return fmt::format("pid {} on host {}, started {}\n", ::getpid(), host.data(), started.data());
}

// The holder's line, as printable text: the file is the holder's to write, but anyone's to edit.
std::string read_holder(int fd) {
  std::array<char, 512> bytes{};
  const ssize_t count = ::pread(fd, bytes.data(), bytes.size(), 0);
  std::string line;
  for (ssize_t i = 0; i < count && bytes[i] != '\n'; ++i)
    if (bytes[i] >= 0x20 && bytes[i] < 0x7f) line += bytes[i];
  return line.empty() ? "which has not written who it is yet" : line;
}

bool holds_only_the_lock(const std::filesystem::path& directory) {
  std::error_code error;
  std::vector<std::filesystem::path> entries;
  for (std::filesystem::directory_iterator entry(directory, error), end; !error && entry != end;
       entry.increment(error)) {
    entries.push_back(entry->path().filename());
  }
  return !error && entries.size() == 1 && entries.front() == kLockName;
}

}  // namespace

RunDirectoryLock::RunDirectoryLock(const std::filesystem::path& run_dir) : run_dir_(run_dir) {
  std::error_code error;
  if (std::filesystem::exists(run_dir, error) && !std::filesystem::is_directory(run_dir, error))
    throw UserError(fmt::format("train.run_dir {} is a file, not a directory", run_dir.string()));
  made_directory_ = std::filesystem::create_directories(run_dir, error);
  if (error) {
    throw UserError(fmt::format("train.run_dir {}: cannot create the directory: {}",
                                run_dir.string(), error.message()));
  }
  const std::filesystem::path path = run_dir / kLockName;
  // Not through a symbolic link: the file is truncated and written once it is locked.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw UserError(fmt::format(
        "train.run_dir {}: cannot write there ({}): a run writes its checkpoints and metrics "
        "there; give one it may write",
        run_dir.string(), errno == ELOOP ? "run.lock is a symbolic link" : std::strerror(errno)));
  }
  struct stat status {};
  if (::fstat(fd_, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd_);
    throw UserError(fmt::format("{}: not a regular file; remove it", path.string()));
  }
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;  // the whole file
  if (::fcntl(fd_, F_OFD_SETLK, &lock) != 0) {
    const int reason = errno;
    if (reason == EAGAIN || reason == EACCES) {
      const std::string holder = read_holder(fd_);
      ::close(fd_);
      throw UserError(fmt::format(
          "train.run_dir {} is in use by another training run ({}): wait for it to end, or give "
          "this run another train.run_dir (nothing was changed)",
          run_dir.string(), holder));
    }
    spdlog::warn(
        "{}: cannot be locked ({}): nothing keeps a second run out of this directory; do not start "
        "two on it",
        path.string(), std::strerror(reason));
    return;
  }
  const std::string holder = holder_line();
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    spdlog::warn("{}: cannot record this run as the holder: {}", path.string(),
                 std::strerror(errno));
  }
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ < 0) return;
  // Still holding the lock, so that no other run takes the directory meanwhile.
  if (made_directory_ && holds_only_the_lock(run_dir_)) {
    std::error_code ignored;
    std::filesystem::remove(run_dir_ / kLockName, ignored);
    std::filesystem::remove(run_dir_, ignored);
  }
  ::close(fd_);  // which releases the lock
}

}  // namespace mltrain
