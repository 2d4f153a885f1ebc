#include "data/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "common/error.h"
#include "common/input_file.h"
#include "data/mapping_read_guard.h"

namespace mltrain {
namespace {

int64_t nanoseconds(const struct timespec& time) {
  return static_cast<int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

}  // namespace

MappedFile::MappedFile(std::filesystem::path path, std::string role)
    : path_(std::move(path)), role_(std::move(role)) {
  const InputFile file(path_, role_);
  struct stat status {};
  if (::fstat(file.fd(), &status) != 0) {
    throw UserError(
        fmt::format("{}: cannot read {}: {}", path_.string(), role_, std::strerror(errno)));
  }
  opened_ = {status.st_dev, status.st_ino, status.st_size, nanoseconds(status.st_mtim),
             nanoseconds(status.st_ctim)};
  size_ = file.size();
  if (size_ == 0) return;  // mmap refuses an empty length; the caller finds the file too short
  // The mapping keeps the file open once `file` closes its descriptor.
  void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (mapping == MAP_FAILED) {
    throw UserError(fmt::format("{}: cannot map: {}", path_.string(), std::strerror(errno)));
  }
  mapping_ = static_cast<const unsigned char*>(mapping);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      role_(std::move(other.role_)),
      opened_(other.opened_),
      mapping_(std::exchange(other.mapping_, nullptr)),
      size_(other.size_) {}

MappedFile::~MappedFile() {
  if (mapping_ != nullptr) ::munmap(const_cast<unsigned char*>(mapping_), size_);
}

void MappedFile::read_in_place(size_t offset, size_t count,
                               const std::function<void(const unsigned char*)>& read) const {
  if (const std::string change = change_since_opened(); !change.empty()) fail_changed(change);
  const MappingReadGuard guard(mapping_ + offset, count);
  read(mapping_ + offset);
  if (guard.faulted()) fail_changed(change_since_opened());
}

void MappedFile::copy(size_t offset, size_t count, void* out) const {
  read_in_place(offset, count, [&](const unsigned char* bytes) { std::memcpy(out, bytes, count); });
}

std::string MappedFile::change_since_opened() const {
  struct stat status {};
  if (::stat(path_.c_str(), &status) != 0) return "it was removed";
  if (status.st_dev != opened_.device || status.st_ino != opened_.inode)
    return "another file was put in its place";
  if (status.st_size != opened_.bytes) {
    return fmt::format("it was {} bytes and is now {} ({})", opened_.bytes, status.st_size,
                       status.st_size < opened_.bytes ? "truncated" : "it grew");
  }
  // The change time too: a write whose modification time was put back (touch -r) still sets it.
  if (nanoseconds(status.st_mtim) != opened_.modified_ns ||
      nanoseconds(status.st_ctim) != opened_.changed_ns)
    return "it was written to";
  return "";
}

void MappedFile::fail_changed(const std::string& what) const {
  throw std::runtime_error(fmt::format(
      "{}: the {} changed while mltrain read it ({}): a {} must stay as it is while a run reads "
      "it; restore it, then resume from the last checkpoint",
      path_.string(), role_,
      what.empty() ? "its contents are no longer the ones it was opened with" : what, role_));
}

void MappedFile::advise_sequential() const {
  if (mapping_ != nullptr) ::madvise(const_cast<unsigned char*>(mapping_), size_, MADV_SEQUENTIAL);
}

void MappedFile::advise_random() const {
  if (mapping_ != nullptr) ::madvise(const_cast<unsigned char*>(mapping_), size_, MADV_RANDOM);
}

}  // namespace mltrain
