#include "trainer/fault_injection.h"

#include <cstdlib>
#include <string>

namespace mltrain {
namespace {

std::string_view faults() {
  const char* value = std::getenv("MLTRAIN_FAULT");
  return value == nullptr ? std::string_view() : std::string_view(value);
}

}  // namespace

bool fault_injected(std::string_view fault) {
  const std::string_view list = faults();
  for (size_t start = 0; start < list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (list.substr(start, end - start) == fault) return true;
    start = end + 1;
  }
  return false;
}

bool nonfinite_gradients_injected(int64_t step) {
  const std::string_view list = faults();
  const std::string_view prefix = "nonfinite-gradients:";
  const size_t at = list.find(prefix);
  if (at == std::string_view::npos) return false;
  const std::string range(list.substr(at + prefix.size(), list.find(',', at) - at - prefix.size()));
  const size_t dash = range.find('-');
  const int64_t first = std::stoll(range.substr(0, dash));
  const int64_t last = dash == std::string::npos ? first : std::stoll(range.substr(dash + 1));
  return step >= first && step <= last;
}

}  // namespace mltrain
