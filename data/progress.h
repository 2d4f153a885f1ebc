#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mltrain {

// Progress of one pass over the input files, for a log line every few seconds: MB read of the
// total, MB/s and an ETA from the input's size.
class ProgressLog {
 public:
  ProgressLog(std::string what, int64_t total_bytes);
  // Whether a line is due: the last is a few seconds old.
  bool due() const;
  // Logs a line; `more` follows the rate (", 1200 documents").
  void log(int64_t bytes_read, const std::string& more = "");
  double seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  int64_t total_bytes_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
};

}  // namespace mltrain
