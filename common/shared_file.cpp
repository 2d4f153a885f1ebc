#include "common/shared_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

namespace mltrain {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int error) {
  throw std::filesystem::filesystem_error(what, path,
                                          std::error_code(error, std::generic_category()));
}

}  // namespace

void make_file_of_size(const std::filesystem::path& path, std::string_view head, uint64_t size) {
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot create", path, errno);
    const auto fail_closing = [&](const char* what) {
      const int error = errno;
      ::close(fd);
      fail(what, path, error);
    };
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) fail_closing("cannot size");
    // The space reserved too where the filesystem can, so that a disk without room fails here
    // rather than in a rank's write; Linux's own call, not posix_fallocate, which where the
    // filesystem cannot (NFS) would write the file a byte a block.
    if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0 && errno != EOPNOTSUPP)
      fail_closing("cannot make room for");
    ::close(fd);
  }
  SharedFileWriter file(path);
  file.write_at(0, head.data(), head.size());
  file.flush();
}

SharedFileWriter::SharedFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open", path_, errno);
  struct stat status {};
  if (::fstat(fd_, &status) != 0) {
    const int error = errno;
    ::close(std::exchange(fd_, -1));
    fail("cannot read the size of", path_, error);
  }
  size_ = static_cast<uint64_t>(status.st_size);
}

SharedFileWriter::~SharedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SharedFileWriter::write_at(uint64_t offset, const void* data, std::size_t size) {
  // A write past the end would grow a file whose size its header fixed.
  if (offset > size_ || size > size_ - offset) fail("would write past the end of", path_, EINVAL);
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_, errno);
    }
    bytes += written;
    offset += static_cast<uint64_t>(written);
    size -= static_cast<std::size_t>(written);
  }
}

void SharedFileWriter::flush() {
  if (::fsync(fd_) != 0) fail("cannot flush", path_, errno);
  const int result = ::close(std::exchange(fd_, -1));
  if (result != 0) fail("cannot close", path_, errno);
}

}  // namespace mltrain
