#include "common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "common/error.h"

namespace mltrain {
namespace {

// What a path names when it is not a regular file, as a message says it.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

UserError not_a_file(const std::filesystem::path& path, std::string_view role, mode_t mode) {
  return UserError(
      fmt::format("{}: the {} is {}, not a file to read", path.string(), role, kind_of(mode)));
}

UserError cannot_open(const std::filesystem::path& path, std::string_view role, int error) {
  return UserError(fmt::format("{}: cannot open the {}: {}", path.string(), role,
                               error == ENOENT ? "no such file" : std::strerror(error)));
}

}  // namespace

InputFile::InputFile(const std::filesystem::path& path, std::string_view role)
    : path_(path), role_(role) {
  // Looked at before it is opened: opening a device can act (a tape rewinds), and a socket cannot
  // be opened at all.
  struct stat status {};
  if (::stat(path_.c_str(), &status) != 0) throw cannot_open(path_, role_, errno);
  if (!S_ISREG(status.st_mode)) throw not_a_file(path_, role_, status.st_mode);
  // Looked at again once open, in case the path changed in between: O_NONBLOCK, so that a named
  // pipe put there meanwhile does not wait for a writer, and O_NOCTTY, so that a terminal does
  // not become this process's.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd_ < 0) throw cannot_open(path_, role_, errno);
  if (::fstat(fd_, &status) != 0 || !S_ISREG(status.st_mode)) {
    const mode_t mode = status.st_mode;
    ::close(fd_);
    throw not_a_file(path_, role_, mode);
  }
  size_ = static_cast<uint64_t>(status.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept
    : path_(std::move(other.path_)),
      role_(std::move(other.role_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_) {}

size_t InputFile::read_some(uint64_t offset, void* out, size_t size) const {
  auto* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t count =
        ::pread(fd_, bytes + done, size - done, static_cast<off_t>(offset + done));
    if (count == 0) break;
    if (count < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(fmt::format("{}: reading the {} failed: {}", path_.string(), role_,
                                           std::strerror(errno)));
    }
    done += static_cast<size_t>(count);
  }
  return done;
}

void InputFile::read_at(uint64_t offset, void* out, size_t size) const {
  if (read_some(offset, out, size) != size) {
    throw UserError(fmt::format("{}: the {} ends before byte {} (truncated?)", path_.string(),
                                role_, offset + size));
  }
}

std::string InputFile::read_all(uint64_t max_bytes) const {
  std::string text;
  constexpr size_t kChunk = size_t{1} << 16;
  while (true) {
    const size_t at = text.size();
    text.resize(at + kChunk);
    const size_t count = read_some(at, text.data() + at, kChunk);
    text.resize(at + count);
    if (text.size() > max_bytes) {
      throw UserError(fmt::format("{}: the {} is larger than {}: is it the right file?",
                                  path_.string(), role_,
                                  max_bytes >= (1u << 20) ? fmt::format("{} MB", max_bytes >> 20)
                                                          : fmt::format("{} bytes", max_bytes)));
    }
    if (count < kChunk) return text;
  }
}

std::string read_text_file(const std::filesystem::path& path, std::string_view role,
                           uint64_t max_bytes) {
  return InputFile(path, role).read_all(max_bytes);
}

}  // namespace mltrain
