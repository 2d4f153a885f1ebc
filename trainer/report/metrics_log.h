#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

namespace mltrain {

// RUN_DIR/metrics.jsonl: one JSON object per line, appended as each is written, so the file is
// readable while the run goes on and keeps every earlier run's lines. A run starts with
// {"event": "start", ...}. Each line is one write to a file opened for appending, so that two
// writers (a run, and an --eval-only beside it) never mix their lines; a last line that a crash cut
// short is ended before the first new one. Failures throw std::filesystem::filesystem_error.
class MetricsLog {
 public:
  explicit MetricsLog(const std::filesystem::path& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const nlohmann::json& record);

 private:
  void append(const std::string& text);

  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace mltrain
