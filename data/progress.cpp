#include "data/progress.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace mltrain {
namespace {

constexpr double kSecondsBetweenLines = 5.0;

double seconds_between(std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

}  // namespace

ProgressLog::ProgressLog(std::string what, int64_t total_bytes)
    : what_(std::move(what)), total_bytes_(total_bytes) {}

bool ProgressLog::due() const {
  return seconds_between(last_, Clock::now()) > kSecondsBetweenLines;
}

double ProgressLog::seconds() const { return seconds_between(start_, Clock::now()); }

void ProgressLog::log(int64_t bytes_read, const std::string& more) {
  last_ = Clock::now();
  const double rate = bytes_read / std::max(seconds(), 1e-9);
  const std::string eta =
      total_bytes_ > bytes_read && rate > 0
          ? fmt::format(", ETA {:.0f} s", static_cast<double>(total_bytes_ - bytes_read) / rate)
          : "";
  // Pipes have no size: then the bytes read alone.
  const std::string read = total_bytes_ > 0
                               ? fmt::format("{:.0f}/{:.0f} MB ({:.0f}%)", bytes_read / 1e6,
                                             total_bytes_ / 1e6, 100.0 * bytes_read / total_bytes_)
                               : fmt::format("{:.0f} MB", bytes_read / 1e6);
  spdlog::info("{}: {}, {:.1f} MB/s{}{}", what_, read, rate / 1e6, more, eta);
}

}  // namespace mltrain
