#include "trainer/precision.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace mltrain {
namespace {

TEST(AutocastGuard, RunsMatmulsInBf16AndRestoresThePreviousState) {
  const c10::Device cpu(c10::kCPU);
  at::autocast::set_autocast_dtype(c10::kCPU, at::kHalf);  // a previous state to restore
  const at::Tensor a = at::randn({4, 4});
  {
    AutocastGuard guard(cpu, /*enabled=*/true);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::autocast::get_autocast_dtype(c10::kCPU), at::kBFloat16);
    EXPECT_EQ(at::matmul(a, a).scalar_type(), at::kBFloat16);
    EXPECT_EQ(a.scalar_type(), at::kFloat) << "the weights stay fp32";
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  EXPECT_EQ(at::autocast::get_autocast_dtype(c10::kCPU), at::kHalf);
  EXPECT_EQ(at::matmul(a, a).scalar_type(), at::kFloat);
  at::autocast::set_autocast_dtype(c10::kCPU, at::kBFloat16);
}

TEST(AutocastGuard, DisabledGuardChangesNothing) {
  const at::Tensor a = at::randn({4, 4});
  AutocastGuard guard(c10::Device(c10::kCPU), /*enabled=*/false);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  EXPECT_EQ(at::matmul(a, a).scalar_type(), at::kFloat);
}

TEST(Bf16Autocast, FollowsTrainPrecision) {
  EXPECT_TRUE(use_bf16_autocast("bf16", c10::Device(c10::kCPU)));
  EXPECT_FALSE(use_bf16_autocast("fp32", c10::Device(c10::kCPU)));
  EXPECT_EQ(use_bf16_autocast("auto", c10::Device(c10::kCPU)), cpu_has_bf16_units());
}

TEST(PrecisionChoice, AutoTakesBf16WhereItIsFastAndFp32Elsewhere) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device gpu(c10::kCUDA, 0);
  EXPECT_TRUE(choose_precision("auto", cpu, /*cpu_bf16_units=*/true).bf16);
  EXPECT_FALSE(choose_precision("auto", cpu, /*cpu_bf16_units=*/false).bf16);
  EXPECT_TRUE(choose_precision("auto", gpu, /*cpu_bf16_units=*/false).bf16);
  for (const bool units : {true, false}) {
    const PrecisionChoice choice = choose_precision("auto", cpu, units);
    EXPECT_FALSE(choice.emulated);
    EXPECT_NE(choice.reason.find(units ? "has bf16 units" : "has no bf16 units"), std::string::npos)
        << choice.reason;
  }
}

TEST(PrecisionChoice, ExplicitChoicesAreTakenAndEmulatedBf16IsFlagged) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device gpu(c10::kCUDA, 0);
  for (const bool units : {true, false}) {
    EXPECT_FALSE(choose_precision("fp32", cpu, units).bf16);
    EXPECT_FALSE(choose_precision("fp32", gpu, units).bf16);
    EXPECT_TRUE(choose_precision("bf16", gpu, units).bf16);
    EXPECT_FALSE(choose_precision("bf16", gpu, units).emulated);
  }
  const PrecisionChoice fast = choose_precision("bf16", cpu, /*cpu_bf16_units=*/true);
  EXPECT_TRUE(fast.bf16);
  EXPECT_FALSE(fast.emulated);
  const PrecisionChoice emulated = choose_precision("bf16", cpu, /*cpu_bf16_units=*/false);
  EXPECT_TRUE(emulated.bf16) << "asked for, so taken";
  EXPECT_TRUE(emulated.emulated);
  EXPECT_NE(emulated.reason.find("slower than fp32"), std::string::npos) << emulated.reason;
}

// The kernel's own list of the CPU's flags is the independent reference.
TEST(Bf16Autocast, FindsTheCpusBf16UnitsAsTheKernelListsThem) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  bool listed = false;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (!line.starts_with("flags")) continue;
    std::istringstream flags(line);
    for (std::string flag; flags >> flag;)
      listed = listed || flag == "amx_bf16" || flag == "avx512_bf16";
    break;
  }
  EXPECT_EQ(cpu_has_bf16_units(), listed);
}

}  // namespace
}  // namespace mltrain
