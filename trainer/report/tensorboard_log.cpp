#include "trainer/report/tensorboard_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>

#include "trainer/report/output_directory.h"

namespace mltrain {
namespace {

// Protocol buffer wire format: a field's key is (number << 3 | wire type).
enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void put_key(std::string& out, int field, WireType type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | type);
}

template <class T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow/core/util/event.proto: Event {double wall_time = 1; int64 step = 2; oneof what
// {string file_version = 3; Summary summary = 5;}}. summary.proto: Summary {repeated Value value =
// 1;}, Value {string tag = 1; float simple_value = 2;}.
std::string event(int64_t step, const std::string& what, int what_field) {
  std::string out;
  put_key(out, 1, kFixed64);
  put_little_endian(
      out,
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  put_key(out, 2, kVarint);
  put_varint(out, static_cast<uint64_t>(step));
  put_bytes(out, what_field, what);
  return out;
}

std::string summary(const std::vector<std::pair<std::string, double>>& scalars) {
  std::string out;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, 1, tag);
    put_key(entry, 2, kFixed32);
    put_little_endian(entry, static_cast<float>(value));
    put_bytes(out, 1, entry);
  }
  return out;
}

// TFRecord's mask keeps a CRC of data that holds CRCs from looking like one.
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8U; }

[[noreturn]] void fail(const char* what, const std::filesystem::path& path, int error) {
  throw std::filesystem::filesystem_error(what, path,
                                          std::error_code(error, std::generic_category()));
}

}  // namespace

uint32_t crc32c(const std::string& data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> entries{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78U : 0);
      entries[i] = crc;
    }
    return entries;
  }();
  uint32_t crc = 0xFFFFFFFFU;
  for (const char c : data) crc = table[(crc ^ static_cast<uint8_t>(c)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

TensorBoardLog::TensorBoardLog(const std::filesystem::path& directory) {
  make_output_directory(directory, "train.tensorboard", "TensorBoard's event files");
  char host[256] = "host";
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  // A name of its own per run and process: a resumed run adds a file beside the earlier ones.
  path_ = directory / fmt::format("events.out.tfevents.{}.{}.{}", seconds, host, ::getpid());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create the TensorBoard event file", path_, errno);
  append_record(event(0, "brain.Event:2", 3));
}

TensorBoardLog::~TensorBoardLog() { ::close(fd_); }

void TensorBoardLog::write(int64_t step,
                           const std::vector<std::pair<std::string, double>>& scalars) {
  append_record(event(step, summary(scalars), 5));
}

void TensorBoardLog::append_record(const std::string& record) {
  std::string frame;
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(record.size()));
  frame += length;
  put_little_endian(frame, masked(crc32c(length)));
  frame += record;
  put_little_endian(frame, masked(crc32c(record)));
  const ssize_t written = ::write(fd_, frame.data(), frame.size());
  if (written != static_cast<ssize_t>(frame.size()))
    fail("cannot write the TensorBoard event file", path_, written < 0 ? errno : ENOSPC);
}

}  // namespace mltrain
