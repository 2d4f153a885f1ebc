#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace mltrain {

// A data file that training reads in place (a token shard, a loss mask), mapped read-only and
// never copied whole. The file must stay as it is while it is mapped: a mapping alone would
// crash (SIGBUS) on a truncated file or read other data from a replaced one. So every read is
// checked against the file as it was opened (its inode, size and times), and a change is a
// runtime error that names the file, its `role` and what changed.
class MappedFile {
 public:
  // Opening a file that cannot be read or mapped is a UserError naming it.
  MappedFile(std::filesystem::path path, std::string role);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile& operator=(MappedFile&&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const unsigned char* bytes() const { return mapping_; }
  size_t size() const { return size_; }

  // Calls read(bytes() + offset) to read [offset, offset + count) in place, failing as above when
  // the file changed before or while it is read.
  void read_in_place(size_t offset, size_t count,
                     const std::function<void(const unsigned char*)>& read) const;
  // Copies [offset, offset + count) into out (read_in_place).
  void copy(size_t offset, size_t count, void* out) const;

  // How the file at path() differs from the one opened; empty when it does not.
  std::string change_since_opened() const;
  // The runtime error for a change found by a read: `what` says it, or, empty, that the contents
  // differ from those the file was opened with (seen by a check of what was read).
  [[noreturn]] void fail_changed(const std::string& what) const;

  // madvise(): how training will read the mapping.
  void advise_sequential() const;
  void advise_random() const;

 private:
  // What identifies the file's contents as they were opened.
  struct Identity {
    dev_t device;
    ino_t inode;
    int64_t bytes;
    int64_t modified_ns;
    int64_t changed_ns;  // of the inode, which no user can set back
  };

  std::filesystem::path path_;
  std::string role_;
  Identity opened_{};
  const unsigned char* mapping_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mltrain
