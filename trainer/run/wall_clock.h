#pragma once

#include <chrono>

namespace mltrain {

// The host's wall clock, for the step's timings, the log's speed and the ETA.
using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

inline double seconds_since(Clock::time_point start) {
  return seconds_between(start, Clock::now());
}

}  // namespace mltrain
