#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace mltrain {

void setup_logging(int rank) {
  spdlog::drop("mltrain");  // a second call, once the rank is known, replaces the first's
  auto logger = spdlog::stderr_color_mt("mltrain");
  if (rank == 0) {
    logger->set_pattern("[%H:%M:%S] %^%v%$");
    logger->set_level(spdlog::level::info);
  } else {
    logger->set_pattern("[%H:%M:%S rank " + std::to_string(rank) + "] %^%l: %v%$");
    logger->set_level(spdlog::level::warn);
  }
  spdlog::set_default_logger(logger);
}

}  // namespace mltrain
