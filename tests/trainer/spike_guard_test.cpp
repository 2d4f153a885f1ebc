// The spike guard's arithmetic, against closed forms: the level's average, the factor, the floor.
#include "trainer/run/spike_guard.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace mltrain {
namespace {

at::Tensor loss(double value) { return at::full({}, value, at::kDouble); }
at::Tensor skipped(bool value) { return at::full({}, value ? 1.0 : 0.0, at::kFloat); }

TEST(SpikeGuard, TheLevelIsAnAverageOfTheAppliedStepsLosses) {
  SpikeGuard guard(2.0, 0.0, at::kCPU);
  EXPECT_FALSE(guard.is_spike(loss(100.0)).item<bool>()) << "no level before the first step";
  guard.follow(loss(4.0), skipped(false));
  EXPECT_DOUBLE_EQ(guard.level(), 4.0);
  guard.follow(loss(2.0), skipped(false));
  EXPECT_DOUBLE_EQ(guard.level(), 0.9 * 4.0 + 0.1 * 2.0);
  guard.follow(loss(1000.0), skipped(true));
  EXPECT_DOUBLE_EQ(guard.level(), 3.8) << "a skipped step leaves the level";
  EXPECT_DOUBLE_EQ(guard.level_now().item<double>(), 3.8);
}

TEST(SpikeGuard, ALossAboveTheFactorTimesTheLevelIsASpike) {
  const SpikeGuard guard(2.0, 3.0, at::kCPU);
  EXPECT_FALSE(guard.is_spike(loss(6.0)).item<bool>());
  EXPECT_TRUE(guard.is_spike(loss(6.001)).item<bool>());
  EXPECT_FALSE(SpikeGuard(0.0, 3.0, at::kCPU).is_spike(loss(1e9)).item<bool>()) << "0 is off";
}

// Near a loss of 0 (a memorised batch), a loss many times its tiny level is noise, not a spike.
TEST(SpikeGuard, ALevelUnderATenthIsJudgedAsATenth) {
  const SpikeGuard guard(2.0, 1e-5, at::kCPU);
  EXPECT_FALSE(guard.is_spike(loss(1e-3)).item<bool>());
  EXPECT_FALSE(guard.is_spike(loss(0.2)).item<bool>());
  EXPECT_TRUE(guard.is_spike(loss(0.21)).item<bool>());
}

}  // namespace
}  // namespace mltrain
