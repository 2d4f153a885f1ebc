#include "trainer/report/step_profiler.h"

#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace mltrain {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

constexpr size_t kTableRows = 15;

// The operations that took the most time, each event's whole duration (its children included, as
// torch.profiler's "total" column counts it), summed by name over the traced steps.
std::string costliest_operations(const std::vector<profiler::KinetoEvent>& events) {
  std::map<std::string, std::pair<uint64_t, int64_t>> by_name;  // total ns, calls
  for (const profiler::KinetoEvent& event : events) {
    auto& [nanoseconds, calls] = by_name[event.name()];
    nanoseconds += event.durationNs();
    ++calls;
  }
  std::vector<std::pair<std::string, std::pair<uint64_t, int64_t>>> rows(by_name.begin(),
                                                                         by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string table = fmt::format("{:>12}  {:>8}  {}\n", "total ms", "calls", "operation");
  for (size_t i = 0; i < std::min(rows.size(), kTableRows); ++i) {
    const auto& [name, totals] = rows[i];
    table += fmt::format("{:>12.2f}  {:>8}  {}\n", static_cast<double>(totals.first) / 1e6,
                         totals.second, name);
  }
  return table;
}

}  // namespace

StepProfiler::StepProfiler(std::optional<StepRange> steps, std::filesystem::path directory,
                           bool cuda)
    : steps_(steps), directory_(std::move(directory)), cuda_(cuda) {
  // Made now, before any step: a file in its place stops the run here (exit 2), not after the
  // steps it would trace.
  if (steps_) std::filesystem::create_directories(directory_);
}

StepProfiler::~StepProfiler() {
  if (tracing_) profiler::disableProfiler();
}

void StepProfiler::before_step(int64_t step) {
  // A rollback (train.max_bad_steps) can bring the first step round again while it traces.
  if (!steps_ || tracing_ || step != steps_->first) return;
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  tracing_ = true;
}

void StepProfiler::after_step(int64_t step) {
  if (!tracing_ || step != steps_->last) return;
  tracing_ = false;
  // The last step's kernels are in the trace only once they have run.
  if (cuda_) c10::cuda::device_synchronize();
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  const std::filesystem::path trace =
      directory_ / fmt::format("steps_{}-{}.json", steps_->first, steps_->last);
  // A trace is a diagnosis: one that cannot be written (a full disk) is said, and training goes on.
  try {
    result->save(trace.string());
  } catch (const std::exception& error) {
    spdlog::warn("the profile of steps {} to {} could not be written to {}: {}", steps_->first,
                 steps_->last, trace.string(), error.what());
    return;
  }
  spdlog::info("profile of steps {} to {}: {} (chrome://tracing or ui.perfetto.dev)\n{}",
               steps_->first, steps_->last, trace.string(), costliest_operations(result->events()));
}

}  // namespace mltrain
