#include "common/directory_lock.h"

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
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"

namespace mltrain {
namespace {

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

// A file's type, in words for a message that says it is in the way.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// The error for something other than a regular file (of type `mode`) at the lock file's `path`:
// it is what stops the owner, not the directory.
UserError not_a_lock_file(const DirectoryLock::Names& names, const std::filesystem::path& directory,
                          const std::filesystem::path& path, mode_t mode) {
  return UserError(fmt::format(
      "{} {}: {} is {}, where the {} keeps its lock file: move it away (nothing was changed)",
      names.setting, directory.string(), path.string(), kind_of(mode), names.owner));
}

bool holds_only(const std::filesystem::path& directory, const std::string& name) {
  std::error_code error;
  std::vector<std::filesystem::path> entries;
  for (std::filesystem::directory_iterator entry(directory, error), end; !error && entry != end;
       entry.increment(error)) {
    entries.push_back(entry->path().filename());
  }
  return !error && entries.size() == 1 && entries.front() == name;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::filesystem::path& directory, Names names)
    : directory_(directory), names_(std::move(names)) {
  std::error_code error;
  if (std::filesystem::exists(directory_, error) &&
      !std::filesystem::is_directory(directory_, error)) {
    throw UserError(
        fmt::format("{} {} is a file, not a directory: give a directory, or move it away",
                    names_.setting, directory_.string()));
  }
  made_directory_ = std::filesystem::create_directories(directory_, error);
  if (error) {
    throw UserError(fmt::format("{} {}: cannot create the directory: {}", names_.setting,
                                directory_.string(), error.message()));
  }
  take();
  check_writable();
}

void DirectoryLock::take() {
  // An owner that removes the lock file on release can do so between this opening it and locking
  // it: the file locked is then no longer the directory's, and the opening is done again.
  while (!try_lock(directory_ / names_.lock_file)) {
  }
  if (!locked_) return;
  const std::string holder = holder_line();
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    spdlog::warn("{}: cannot record who holds it: {}", (directory_ / names_.lock_file).string(),
                 std::strerror(errno));
  }
}

void DirectoryLock::keep_held() {
  if (!locked_) return;
  const std::filesystem::path path = directory_ / names_.lock_file;
  struct stat there {};
  struct stat held {};
  if (::stat(path.c_str(), &there) == 0 && ::fstat(fd_, &held) == 0 &&
      there.st_ino == held.st_ino && there.st_dev == held.st_dev)
    return;
  ::close(fd_);
  fd_ = -1;
  locked_ = false;
  try {
    take();
  } catch (const UserError& failure) {
    throw UserError(fmt::format(
        "{} was removed or replaced while this {} held it, and cannot be taken again ({}): this "
        "one stops, and what it saved is kept; let one {} at a time use the directory",
        path.string(), names_.owner, failure.what(), names_.owner));
  }
  spdlog::warn("{} was removed while this {} held it (taken for a stale lock?): taken again",
               path.string(), names_.owner);
}

bool DirectoryLock::try_lock(const std::filesystem::path& path) {
  // Not through a symbolic link: the file is truncated and written once it is locked.
  fd_ =
      ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int reason = errno;
    struct stat there {};
    if (::lstat(path.c_str(), &there) == 0 && !S_ISREG(there.st_mode))
      throw not_a_lock_file(names_, directory_, path, there.st_mode);
    throw UserError(fmt::format("{} {}: cannot write there ({}); give one the {} may write",
                                names_.setting, directory_.string(), std::strerror(reason),
                                names_.owner));
  }
  struct stat opened {};
  if (::fstat(fd_, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw not_a_lock_file(names_, directory_, path, opened.st_mode);
  }
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;  // the whole file
  if (::fcntl(fd_, F_OFD_SETLK, &lock) != 0) {
    const int reason = errno;
    if (reason == EAGAIN || reason == EACCES) {
      const std::string holder = read_holder(fd_);
      ::close(fd_);
      fd_ = -1;
      throw UserError(fmt::format(
          "{} {} is in use by another {} ({}): wait for it to end, or give this one another {} "
          "(nothing was changed)",
          names_.setting, directory_.string(), names_.owner, holder, names_.setting));
    }
    spdlog::warn("{}: cannot be locked ({}): nothing keeps a second {} out of this directory",
                 path.string(), std::strerror(reason), names_.owner);
    return true;
  }
  struct stat there {};
  if (::stat(path.c_str(), &there) != 0 || there.st_ino != opened.st_ino ||
      there.st_dev != opened.st_dev) {
    ::close(fd_);
    fd_ = -1;
    return false;
  }
  locked_ = true;
  return true;
}

// The lock file may be there already, and be writable where the directory is not.
void DirectoryLock::check_writable() const {
  if (const auto reason = unwritable_reason(directory_)) {
    throw UserError(fmt::format("{} {}: cannot write there ({}); give one the {} may write",
                                names_.setting, directory_.string(), *reason, names_.owner));
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // Still holding the lock, so that no other owner takes the directory meanwhile.
  std::error_code ignored;
  if (made_directory_ && holds_only(directory_, names_.lock_file)) {
    std::filesystem::remove(directory_ / names_.lock_file, ignored);
    std::filesystem::remove(directory_, ignored);
  } else if (locked_ && !names_.keep_lock_file) {
    std::filesystem::remove(directory_ / names_.lock_file, ignored);
  }
  ::close(fd_);  // which releases the lock
}

}  // namespace mltrain
