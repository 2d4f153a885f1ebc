#include "trainer/report/step_profiler.h"

#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/error.h"
#include "trainer/report/output_directory.h"

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

// Why the trace the profiler was asked to save at `saved` is not now at `trace`, renamed there
// whole; empty where it is.
std::string unsaved_reason(const std::filesystem::path& saved, const std::filesystem::path& trace) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(std::filesystem::status(saved, error)))
    return "the profiler wrote no file; its own message above says why";
  const uintmax_t bytes = std::filesystem::file_size(saved, error);
  if (error) return fmt::format("its size could not be read: {}", error.message());
  if (bytes == 0) {
    std::filesystem::remove(saved, error);
    return "the profiler wrote an empty file";
  }
  std::filesystem::rename(saved, trace, error);
  if (error) {
    return fmt::format("the trace is in {}, which could not be renamed to it: {}", saved.string(),
                       error.message());
  }
  return "";
}

}  // namespace

StepProfiler::StepProfiler(std::optional<StepRange> steps, std::filesystem::path directory,
                           bool cuda)
    : steps_(steps), directory_(std::move(directory)), cuda_(cuda) {
  if (!steps_) return;
  // Made and checked now, before any step: what would keep the trace from being written stops the
  // run here (exit 2), not after the steps it would trace.
  make_output_directory(directory_, "train.profile_steps", "the profiler's traces");
  std::error_code error;
  const std::filesystem::path trace = trace_path();
  if (std::filesystem::exists(std::filesystem::symlink_status(trace, error)) &&
      !std::filesystem::is_regular_file(std::filesystem::status(trace, error))) {
    throw UserError(fmt::format(
        "train.profile_steps: {} is {}, where the trace of steps {} to {} goes: move it away",
        trace.string(), what_stands_at(trace).value_or("in the way"), steps_->first, steps_->last));
  }
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
  const std::filesystem::path trace = trace_path();
  // A trace is a diagnosis: one that cannot be written (a full disk, its directory gone) is said,
  // and training goes on. Kineto says a file it could not write only in its own log, and returns
  // as if it had: the trace is saved beside its final name, checked there, and only then renamed
  // over it, so that neither a missing trace nor an earlier run's of the same steps is reported as
  // this one's, and an earlier one is kept where this one fails.
  const std::filesystem::path saved = trace.string() + ".new";
  std::error_code ignored;
  std::filesystem::remove(saved, ignored);
  std::string failure;
  try {
    result->save(saved.string());
    failure = unsaved_reason(saved, trace);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  if (!failure.empty()) {
    spdlog::warn(
        "train.profile_steps: no trace of steps {} to {} was written to {} ({}); training "
        "goes on",
        steps_->first, steps_->last, trace.string(), failure);
    return;
  }
  spdlog::info("profile of steps {} to {}: {} (chrome://tracing or ui.perfetto.dev)\n{}",
               steps_->first, steps_->last, trace.string(), costliest_operations(result->events()));
}

std::filesystem::path StepProfiler::trace_path() const {
  return directory_ / fmt::format("steps_{}-{}.json", steps_->first, steps_->last);
}

}  // namespace mltrain
