#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace mltrain {

// Scalars for TensorBoard (train.tensorboard): one event file in DIRECTORY, named as TensorBoard
// looks for them (events.out.tfevents.TIME.HOST), that starts with the file version and gets one
// Event per write, each scalar a Summary value. The file is TFRecord framing (length, masked
// CRC-32C of the length, the record, masked CRC-32C of the record) around Event protocol buffers.
// No Debian package writes these, and the four messages need seven fields, so they are encoded
// here, as tensorboard's own summary/writer/record_writer.py does in Python. Every write goes to
// the file before it returns, so TensorBoard shows a run while it goes on. A DIRECTORY that cannot
// be (something else in its place) or cannot be written in is a UserError naming
// train.tensorboard, said when the log is made, before the first step; a file that cannot be made
// or written there all the same (a full disk) throws std::filesystem::filesystem_error.
class TensorBoardLog {
 public:
  explicit TensorBoardLog(const std::filesystem::path& directory);
  ~TensorBoardLog();
  TensorBoardLog(const TensorBoardLog&) = delete;
  TensorBoardLog& operator=(const TensorBoardLog&) = delete;

  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

 private:
  void append_record(const std::string& event);

  std::filesystem::path path_;
  int fd_ = -1;
};

// CRC-32C (Castagnoli) of `data`, as TFRecord frames checksum it before masking.
uint32_t crc32c(const std::string& data);

}  // namespace mltrain
