#include "trainer/metrics_log.h"

#include <stdexcept>

namespace mltrain {

MetricsLog::MetricsLog(const std::filesystem::path& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw std::runtime_error("cannot open " + path.string() + " for writing");
}

void MetricsLog::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write " + path_.string());
}

}  // namespace mltrain
