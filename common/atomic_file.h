#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace mltrain {

// Writes a file so that a reader never sees a partial one: the bytes go to a temporary file beside
// the target, which commit() flushes with fsync, renames over the target and makes durable by
// syncing the directory. Destroyed without commit() (an exception, a failed write) it removes the
// temporary and leaves any existing target untouched. Write failures (disk full, permissions)
// throw std::filesystem::filesystem_error naming the path, with the reason as its code.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path target);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Overwrites bytes already written, at `offset` from the start: for a header whose contents are
  // known only at the end. The file position stays where write() left it.
  void write_at(std::size_t offset, const void* data, std::size_t size);
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temporary_;
  int fd_ = -1;
};

// Writes `text` as the whole of `path`, atomically (see AtomicFileWriter).
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// Flushes a directory entry (a rename or a new file in it) to disk.
void fsync_directory(const std::filesystem::path& directory);

// Why no file can be made in `directory` (permissions, a read-only filesystem), found by making and
// removing one; none where one can.
std::optional<std::string> unwritable_reason(const std::filesystem::path& directory);

}  // namespace mltrain
