#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace mltrain {

// Where a file's bytes come from: the file itself, or its gzip or zstd decompression.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `size` bytes into `out`; 0 at the end. A damaged stream is a UserError naming the file.
  virtual size_t read(char* out, size_t size) = 0;
  // Bytes of the file (compressed, where it is) consumed so far.
  virtual int64_t consumed() const = 0;
};

enum class Compression { kNone, kGzip, kZstd };

// The lines of a file, compressed with gzip or zstd or not at all, as its first bytes tell, not
// its name (a pipe is read uncompressed). Lines end at '\n', which is not part of them; the last
// line may lack one. A line may be of any length. An unreadable file or damaged compressed data is
// a UserError naming the file.
class LineReader {
 public:
  explicit LineReader(const std::filesystem::path& path);
  ~LineReader();

  // The next line into `line`; false at the end of the file.
  bool next(std::string& line);

  Compression compression() const { return compression_; }
  // Bytes of the file consumed so far: its size at the end, compressed or not.
  int64_t consumed() const { return source_->consumed(); }

 private:
  void refill();

  Compression compression_ = Compression::kNone;
  std::unique_ptr<ByteSource> source_;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // the unread bytes are buffer_[begin_, end_)
  size_t end_ = 0;
  size_t scanned_ = 0;  // buffer_[begin_, scanned_) holds no newline: a long line is scanned once
  bool at_end_ = false;
};

}  // namespace mltrain
