#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

namespace mltrain {

// A file that several processes fill together, each its own byte ranges (a checkpoint that every
// rank writes its part of): one makes it at its full size, then each opens it, writes at offsets
// and flushes. Failures throw std::filesystem::filesystem_error naming the path, with the reason
// as its code, as AtomicFileWriter's do.

// Makes `path` (replacing what is there) `size` bytes long, `head` at its start and zeros after,
// and flushes it to disk.
void make_file_of_size(const std::filesystem::path& path, std::string_view head, uint64_t size);

// Writes into an existing file at offsets, never past its end.
class SharedFileWriter {
 public:
  explicit SharedFileWriter(std::filesystem::path path);
  ~SharedFileWriter();
  SharedFileWriter(const SharedFileWriter&) = delete;
  SharedFileWriter& operator=(const SharedFileWriter&) = delete;

  void write_at(uint64_t offset, const void* data, std::size_t size);
  // Flushes what was written to disk and closes the file.
  void flush();

 private:
  std::filesystem::path path_;
  uint64_t size_ = 0;
  int fd_ = -1;
};

}  // namespace mltrain
