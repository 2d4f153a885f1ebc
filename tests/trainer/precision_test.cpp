#include "trainer/machine/precision.h"
#include "model/autocast_region.h"

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
  EXPECT_EQ(use_bf16_autocast("auto", c10::Device(c10::kCPU)), cpu_bf16_support() == CpuBf16::amx);
}

constexpr CpuBf16 kEveryCpu[] = {CpuBf16::emulated, CpuBf16::avx512_bf16, CpuBf16::amx};

TEST(PrecisionChoice, AutoTakesBf16OnlyWhereItIsFasterThanFp32) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device gpu(c10::kCUDA, 0);
  EXPECT_TRUE(choose_precision("auto", cpu, CpuBf16::amx).bf16);
  // AVX512-BF16 without AMX: bf16 products measured at 0.6x the fp32 rate (bench/RESULTS.md).
  EXPECT_FALSE(choose_precision("auto", cpu, CpuBf16::avx512_bf16).bf16);
  EXPECT_FALSE(choose_precision("auto", cpu, CpuBf16::emulated).bf16);
  for (const CpuBf16 cpu_bf16 : kEveryCpu) {
    EXPECT_TRUE(choose_precision("auto", gpu, cpu_bf16).bf16);
    const PrecisionChoice choice = choose_precision("auto", cpu, cpu_bf16);
    EXPECT_FALSE(choice.slower_than_fp32) << "auto never picks the slower one";
  }
  EXPECT_NE(choose_precision("auto", cpu, CpuBf16::amx).reason.find("has AMX-BF16"),
            std::string::npos);
  EXPECT_NE(choose_precision("auto", cpu, CpuBf16::avx512_bf16).reason.find("without AMX-BF16"),
            std::string::npos);
  EXPECT_NE(choose_precision("auto", cpu, CpuBf16::emulated).reason.find("emulated"),
            std::string::npos);
}

TEST(PrecisionChoice, ExplicitChoicesAreTakenAndSlowBf16IsFlagged) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device gpu(c10::kCUDA, 0);
  for (const CpuBf16 cpu_bf16 : kEveryCpu) {
    EXPECT_FALSE(choose_precision("fp32", cpu, cpu_bf16).bf16);
    EXPECT_FALSE(choose_precision("fp32", gpu, cpu_bf16).bf16);
    EXPECT_TRUE(choose_precision("bf16", gpu, cpu_bf16).bf16);
    EXPECT_FALSE(choose_precision("bf16", gpu, cpu_bf16).slower_than_fp32);
    EXPECT_TRUE(choose_precision("bf16", cpu, cpu_bf16).bf16) << "asked for, so taken";
  }
  EXPECT_FALSE(choose_precision("bf16", cpu, CpuBf16::amx).slower_than_fp32);
  for (const CpuBf16 slow : {CpuBf16::avx512_bf16, CpuBf16::emulated}) {
    const PrecisionChoice choice = choose_precision("bf16", cpu, slow);
    EXPECT_TRUE(choice.slower_than_fp32);
    EXPECT_NE(choice.reason.find("slower than fp32"), std::string::npos) << choice.reason;
    EXPECT_NE(choice.reason.find("auto or fp32 takes fp32 here"), std::string::npos)
        << "the way out is named: " << choice.reason;
  }
}

// The kernel's own list of the CPU's flags is the independent reference.
TEST(Bf16Autocast, FindsTheCpusBf16UnitsAsTheKernelListsThem) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  bool amx = false;
  bool avx512_bf16 = false;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (!line.starts_with("flags")) continue;
    std::istringstream flags(line);
    for (std::string flag; flags >> flag;) {
      amx = amx || flag == "amx_bf16";
      avx512_bf16 = avx512_bf16 || flag == "avx512_bf16";
    }
    break;
  }
  const CpuBf16 listed = amx           ? CpuBf16::amx
                         : avx512_bf16 ? CpuBf16::avx512_bf16
                                       : CpuBf16::emulated;
  EXPECT_EQ(cpu_bf16_support(), listed);
}

}  // namespace
}  // namespace mltrain
