#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace mltrain {

// A file mltrain was given to read: a config, a checkpoint's files, weights, shards, a tokenizer.
// A path can name something that is no file to read: a directory, a named pipe (whose opening
// waits for a writer, for ever), a device (/dev/zero never ends) or a socket. InputFile opens
// without waiting and refuses all but a regular file, with one UserError that names the path,
// what it was meant to be (`role`: "config file", "token shard", ...) and what it is instead.
class InputFile {
 public:
  InputFile(const std::filesystem::path& path, std::string_view role);
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  InputFile& operator=(InputFile&&) = delete;

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }  // when it was opened

  // Reads exactly `size` bytes from `offset`. A file that ends before is a UserError (truncated);
  // a failing read (an I/O error) a runtime error.
  void read_at(uint64_t offset, void* out, size_t size) const;

  // Up to `size` bytes from `offset`, fewer only at the end of the file.
  size_t read_some(uint64_t offset, void* out, size_t size) const;

  // The whole file, read to its end (files in /proc report no size); more than max_bytes is a
  // UserError, so that a huge file given by mistake is not read into memory.
  std::string read_all(uint64_t max_bytes) const;

 private:
  std::filesystem::path path_;
  std::string role_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Text files mltrain reads whole (configs, JSON, `latest`) are far below this.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{64} << 20;

// The whole of a text file, through InputFile.
std::string read_text_file(const std::filesystem::path& path, std::string_view role,
                           uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace mltrain
