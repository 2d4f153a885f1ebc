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
// and checked when the profiler is: something in the way of the trace (a file in the directory's
// place, a directory in the trace's) or a directory it cannot write in is a UserError naming
// train.profile_steps then, before the first step. A trace that cannot be written all the same (a
// full disk) is a warning that says no trace was written, not the run's end.
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
  std::filesystem::path trace_path() const;

  std::optional<StepRange> steps_;
  std::filesystem::path directory_;
  bool cuda_;
  bool tracing_ = false;
};

}  // namespace mltrain
