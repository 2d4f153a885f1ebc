// StepProfiler (train.profile_steps) says what keeps a trace from being written: before the first
// step, as a UserError naming the key, the path and what to do; after the traced steps, as a
// warning that no trace was written, never the trace's path as if it had been.
#include "trainer/report/step_profiler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/error.h"
#include "common/file_tree.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

constexpr StepRange kSteps{.first = 2, .last = 3};

// The UserError that making a profiler of kSteps into `directory` gives; empty where it is made.
std::string refusal(const std::filesystem::path& directory) {
  try {
    const StepProfiler profiler(kSteps, directory, /*cuda=*/false);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

// What `profiler` logs as it traces kSteps, with `between` done after the first step, before the
// trace is written.
std::string trace_steps(StepProfiler& profiler, const std::function<void()>& between = {}) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  for (int64_t step = kSteps.first; step <= kSteps.last; ++step) {
    profiler.before_step(step);
    at::Tensor x = at::randn({16, 16});
    x = at::matmul(x, x).relu().sum();
    if (step == kSteps.first && between) between();
    profiler.after_step(step);
  }
  return ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
}

TEST(StepProfiler, SomethingInTheWayIsAUserErrorNamingTheKeyBeforeAnyStep) {
  TemporaryDirectory dir;
  testing::write_text(dir / "file", "not a directory");
  EXPECT_EQ(refusal(dir / "file"), "train.profile_steps: " + (dir / "file").string() +
                                       " is a file, where the profiler's traces go: move it "
                                       "away, or turn train.profile_steps off");
  std::filesystem::create_symlink(dir / "nowhere", dir / "link");
  EXPECT_CONTAINS(refusal(dir / "link"),
                  (dir / "link").string() + " is a symbolic link to nothing");
  // Below a file, no directory can be made.
  EXPECT_CONTAINS(refusal(dir / "file" / "profile"),
                  "train.profile_steps: cannot write the profiler's traces in " +
                      (dir / "file" / "profile").string());
  // A directory where this range's trace goes.
  std::filesystem::create_directories(dir / "profile" / "steps_2-3.json");
  EXPECT_EQ(refusal(dir / "profile"),
            "train.profile_steps: " + (dir / "profile" / "steps_2-3.json").string() +
                " is a directory, where the trace of steps 2 to 3 "
                "goes: move it away");
  // Without a range, nothing is made or checked.
  EXPECT_NO_THROW(StepProfiler(std::nullopt, dir / "file", false));
}

TEST(StepProfiler, AWrittenTraceIsNamedAndNothingIsLeftBeside) {
  TemporaryDirectory dir;
  StepProfiler profiler(kSteps, dir / "profile", /*cuda=*/false);
  const std::string logged = trace_steps(profiler);
  const auto trace = dir / "profile" / "steps_2-3.json";
  EXPECT_CONTAINS(logged, "profile of steps 2 to 3: " + trace.string());
  ASSERT_TRUE(std::filesystem::is_regular_file(trace)) << logged;
  EXPECT_GT(std::filesystem::file_size(trace), 0U);
  EXPECT_EQ(testing::file_contents(dir / "profile").size(), 1U);
}

// The directory replaced by a file while the steps run: Kineto cannot write the trace, says so in
// its own log and returns as if it had.
TEST(StepProfiler, ATraceThatWasNotWrittenIsAWarningAndNotItsPath) {
  TemporaryDirectory dir;
  const auto directory = dir / "profile";
  StepProfiler profiler(kSteps, directory, /*cuda=*/false);
  const std::string logged = trace_steps(profiler, [&] {
    remove_tree(directory);
    testing::write_text(directory, "in the way");
  });
  const auto trace = directory / "steps_2-3.json";
  EXPECT_CONTAINS(logged, "train.profile_steps: no trace of steps 2 to 3 was written to " +
                              trace.string() + " (the profiler wrote no file");
  EXPECT_CONTAINS(logged, "training goes on");
  EXPECT_EQ(logged.find("profile of steps 2 to 3: "), std::string::npos) << logged;
}

}  // namespace
}  // namespace mltrain
