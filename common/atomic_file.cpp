#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace mltrain {
namespace {

// A filesystem_error carries the reason as a code, by which a path the user may not write
// (exit 2) is told from a full disk (exit 1).
[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path) {
  throw std::filesystem::filesystem_error(what, path,
                                          std::error_code(errno, std::generic_category()));
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path target)
    : target_(std::move(target)),
      temporary_(target_.string() + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", temporary_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd_, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", temporary_);
    }
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
}

void AtomicFileWriter::write_at(std::size_t offset, const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", temporary_);
    }
    bytes += written;
    offset += static_cast<std::size_t>(written);
    size -= static_cast<std::size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) fail("cannot flush", temporary_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(temporary_.c_str());
    fail("cannot close", temporary_);
  }
  fd_ = -1;
  if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
    const int rename_errno = errno;
    ::unlink(temporary_.c_str());
    errno = rename_errno;
    fail("cannot rename into place", target_);
  }
  fsync_directory(target_.has_parent_path() ? target_.parent_path() : ".");
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  AtomicFileWriter file(path);
  file.write(text);
  file.commit();
}

void fsync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory", directory);
  const int result = ::fsync(fd);
  ::close(fd);
  if (result != 0) fail("cannot flush directory", directory);
}

std::optional<std::string> unwritable_reason(const std::filesystem::path& directory) {
  const std::filesystem::path probe = directory / (".write-probe." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return std::nullopt;
}

}  // namespace mltrain
