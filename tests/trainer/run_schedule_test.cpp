#include "trainer/run/run_schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace mltrain {
namespace {

TrainConfig intervals(int64_t max_steps, int64_t stop_at) {
  TrainConfig train;
  train.max_steps = max_steps;
  train.stop_at = stop_at;
  train.log_every = 10;
  train.eval_every = 25;
  train.ckpt_every = 40;
  return train;
}

// The steps of a run of `schedule` for which `asked` is true.
template <class Question>
std::vector<int64_t> steps_where(const RunSchedule& schedule, int64_t steps_done, Question asked) {
  std::vector<int64_t> steps;
  for (int64_t done = steps_done; schedule.keep_going(done); ++done) {
    if (asked(done + 1)) steps.push_back(done + 1);
  }
  return steps;
}

TEST(RunSchedule, AFreshRunCountsStepsFromOne) {
  const RunSchedule schedule(intervals(55, 0), 0);
  EXPECT_EQ(schedule.first_step(), 1);
  EXPECT_EQ(schedule.last_step(), 55);
  EXPECT_FALSE(schedule.stops_early());
  EXPECT_EQ(steps_where(schedule, 0, [&](int64_t s) { return schedule.log_now(s); }),
            (std::vector<int64_t>{1, 10, 20, 30, 40, 50, 55}));
  EXPECT_EQ(steps_where(schedule, 0, [&](int64_t s) { return schedule.evaluate_now(s); }),
            (std::vector<int64_t>{25, 50, 55}));
  EXPECT_EQ(steps_where(schedule, 0, [&](int64_t s) { return schedule.checkpoint_now(s); }),
            (std::vector<int64_t>{40, 55}));
}

TEST(RunSchedule, StopAtEndsEarlyWithACheckpointButNoFinalEvaluation) {
  const RunSchedule schedule(intervals(100, 33), 0);
  EXPECT_EQ(schedule.last_step(), 33);
  EXPECT_TRUE(schedule.stops_early());
  EXPECT_EQ(steps_where(schedule, 0, [&](int64_t s) { return schedule.checkpoint_now(s); }),
            (std::vector<int64_t>{33}));
  EXPECT_EQ(steps_where(schedule, 0, [&](int64_t s) { return schedule.evaluate_now(s); }),
            (std::vector<int64_t>{25}));
}

TEST(RunSchedule, AResumedRunLogsItsFirstStepAndKeepsTheIntervals) {
  const RunSchedule schedule(intervals(55, 0), 33);
  EXPECT_EQ(schedule.first_step(), 34);
  EXPECT_EQ(steps_where(schedule, 33, [&](int64_t s) { return schedule.log_now(s); }),
            (std::vector<int64_t>{34, 40, 50, 55}));
  EXPECT_FALSE(schedule.keep_going(55));
  EXPECT_EQ(RunSchedule(intervals(55, 200), 0).last_step(), 55) << "stop_at past max_steps";
}

}  // namespace
}  // namespace mltrain
