#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "trainer/config/config.h"

namespace mltrain {

// Traces the steps of train.profile_steps with torch's profiler (Kineto: the CPU's operators, and
// CUDA's kernels on a GPU), where train_step.cpp's scopes name mltrain's phases (mltrain::data,
// forward, backward, reduce, optimizer). After the last of them it writes the trace, which
// chrome://tracing and Perfetto open, to DIRECTORY/steps_FIRST-LAST.json, and logs the operations
// that took the most time. Without a range it does nothing and costs nothing. The directory is made
// when the profiler is (a file in its place is a filesystem_error then); a trace that cannot be
// written is a warning, not the run's end.
class StepProfiler {
 public:
  StepProfiler(std::optional<StepRange> steps, std::filesystem::path directory, bool cuda);
  // A run that ends inside the range (a stop signal, an error) stops the profiler unwritten.
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void before_step(int64_t step);
  void after_step(int64_t step);

 private:
  std::optional<StepRange> steps_;
  std::filesystem::path directory_;
  bool cuda_;
  bool tracing_ = false;
};

}  // namespace mltrain
