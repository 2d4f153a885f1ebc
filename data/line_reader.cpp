#include "data/line_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace mltrain {
namespace {

// A file's first bytes, as the compressors write them.
constexpr std::array<unsigned char, 2> kGzipMagic = {0x1f, 0x8b};
constexpr std::array<unsigned char, 4> kZstdMagic = {0x28, 0xb5, 0x2f, 0xfd};

// The first read fills this much; a longer line grows the buffer.
constexpr size_t kBufferBytes = size_t{1} << 20;

UserError unreadable(const std::filesystem::path& path) {
  return UserError(
      fmt::format("{}: cannot read the input file: {}", path.string(), std::strerror(errno)));
}

// A file open for reading, closed on destruction. read() returns what is there, as a pipe gives
// it, without waiting to fill the buffer.
struct File {
  explicit File(const std::filesystem::path& path)
      : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) throw unreadable(path);
    if (std::filesystem::is_directory(path)) {
      ::close(fd);
      throw UserError(fmt::format("{}: cannot read the input file: a directory", path.string()));
    }
  }
  ~File() { ::close(fd); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Up to `size` bytes; 0 only at the end of the file.
  size_t read(void* out, size_t size, const std::filesystem::path& path) {
    while (true) {
      const ssize_t count = ::read(fd, out, size);
      if (count >= 0) return static_cast<size_t>(count);
      if (errno != EINTR)
        throw UserError(fmt::format("{}: a read failed: {}", path.string(), std::strerror(errno)));
    }
  }

  int fd;
};

// Peeking reopens the file, which only a regular file allows: a pipe would lose its first bytes,
// so it is read as it comes, uncompressed.
Compression detect(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error))
    return Compression::kNone;
  File file(path);
  std::array<unsigned char, 4> start{};
  size_t count = 0;
  for (size_t got = 1; count < start.size() && got > 0; count += got)
    got = file.read(start.data() + count, start.size() - count, path);
  if (count >= kGzipMagic.size() && std::memcmp(start.data(), kGzipMagic.data(), 2) == 0)
    return Compression::kGzip;
  if (count >= kZstdMagic.size() && std::memcmp(start.data(), kZstdMagic.data(), 4) == 0)
    return Compression::kZstd;
  return Compression::kNone;
}

class PlainSource final : public ByteSource {
 public:
  explicit PlainSource(const std::filesystem::path& path) : path_(path), file_(path) {}
  size_t read(char* out, size_t size) override {
    const size_t count = file_.read(out, size, path_);
    consumed_ += static_cast<int64_t>(count);
    return count;
  }
  int64_t consumed() const override { return consumed_; }

 private:
  std::filesystem::path path_;
  File file_;
  int64_t consumed_ = 0;
};

// zlib's gz* functions: concatenated gzip members read as one stream.
class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(const std::filesystem::path& path)
      : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) throw unreadable(path);
    gzbuffer(file_, kReadBytes);
  }
  ~GzipSource() override { gzclose(file_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(char* out, size_t size) override {
    const int count = gzread(file_, out, static_cast<unsigned>(std::min<size_t>(size, kReadBytes)));
    int error = Z_OK;
    const char* message = gzerror(file_, &error);
    // A truncated file reads to its end and then reports Z_BUF_ERROR.
    if (count < 0 || (error != Z_OK && error != Z_STREAM_END)) {
      throw UserError(fmt::format("{}: damaged gzip data after {} bytes: {}", path_.string(),
                                  consumed(), message));
    }
    return static_cast<size_t>(count);
  }
  int64_t consumed() const override { return gzoffset(file_); }

 private:
  static constexpr unsigned kReadBytes = 1u << 20;
  std::filesystem::path path_;
  gzFile file_;
};

// libzstd's streaming decompression; consecutive frames read as one stream.
class ZstdSource final : public ByteSource {
 public:
  explicit ZstdSource(const std::filesystem::path& path)
      : path_(path), file_(path), context_(ZSTD_createDCtx()), input_(ZSTD_DStreamInSize()) {}
  ~ZstdSource() override { ZSTD_freeDCtx(context_); }
  ZstdSource(const ZstdSource&) = delete;
  ZstdSource& operator=(const ZstdSource&) = delete;

  size_t read(char* out, size_t size) override {
    ZSTD_outBuffer output{out, size, 0};
    while (output.pos == 0) {
      if (in_.pos == in_.size) {
        in_ = {input_.data(), file_.read(input_.data(), input_.size(), path_), 0};
        consumed_ += static_cast<int64_t>(in_.size);
        if (in_.size == 0) {
          // The end of the file: it must also be the end of a frame.
          if (frame_left_ != 0) throw damaged("the data ends inside a frame");
          return 0;
        }
      }
      frame_left_ = ZSTD_decompressStream(context_, &output, &in_);
      if (ZSTD_isError(frame_left_)) throw damaged(ZSTD_getErrorName(frame_left_));
    }
    return output.pos;
  }
  int64_t consumed() const override { return consumed_; }

 private:
  UserError damaged(const std::string& why) const {
    return UserError(
        fmt::format("{}: damaged zstd data after {} bytes: {}", path_.string(), consumed_, why));
  }

  std::filesystem::path path_;
  File file_;
  ZSTD_DCtx* context_;
  std::vector<char> input_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  size_t frame_left_ = 0;  // ZSTD_decompressStream's last hint: 0 at the end of a frame
  int64_t consumed_ = 0;
};

}  // namespace

LineReader::LineReader(const std::filesystem::path& path)
    : compression_(detect(path)), buffer_(kBufferBytes) {
  switch (compression_) {
    case Compression::kNone:
      source_ = std::make_unique<PlainSource>(path);
      break;
    case Compression::kGzip:
      source_ = std::make_unique<GzipSource>(path);
      break;
    case Compression::kZstd:
      source_ = std::make_unique<ZstdSource>(path);
      break;
  }
}

LineReader::~LineReader() = default;

bool LineReader::next(std::string& line) {
  while (true) {
    const char* start = buffer_.data() + begin_;
    const void* newline = std::memchr(buffer_.data() + scanned_, '\n', end_ - scanned_);
    if (newline != nullptr) {
      const size_t length = static_cast<const char*>(newline) - start;
      line.assign(start, length);
      begin_ += length + 1;
      scanned_ = begin_;
      return true;
    }
    scanned_ = end_;
    if (at_end_) {
      if (begin_ == end_) return false;
      line.assign(start, end_ - begin_);
      begin_ = scanned_ = end_;
      return true;
    }
    refill();
  }
}

void LineReader::refill() {
  std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
  end_ -= begin_;
  scanned_ -= begin_;
  begin_ = 0;
  if (end_ == buffer_.size()) buffer_.resize(2 * buffer_.size());  // a line longer than the buffer
  const size_t count = source_->read(buffer_.data() + end_, buffer_.size() - end_);
  end_ += count;
  at_end_ = count == 0;
}

}  // namespace mltrain
