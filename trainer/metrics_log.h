#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace mltrain {

// RUN_DIR/metrics.jsonl: one JSON object per line, appended and flushed as each is written, so the
// file is readable while the run goes on and keeps every earlier run's lines. A run starts with
// {"event": "start", ...}.
class MetricsLog {
 public:
  explicit MetricsLog(const std::filesystem::path& path);
  void write(const nlohmann::json& record);

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace mltrain
