#include "trainer/machine/precision.h"
#include "model/kernels/autocast_region.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"

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

// The casts (aten::_to_copy) that run on this thread while a counter lives.
class CastCounter {
 public:
  CastCounter() : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&observe))) {
    casts_ = 0;
  }
  ~CastCounter() { at::removeCallback(handle_); }
  CastCounter(const CastCounter&) = delete;
  CastCounter& operator=(const CastCounter&) = delete;
  int64_t casts() const { return casts_; }

 private:
  static std::unique_ptr<at::ObserverContext> observe(const at::RecordFunction& function) {
    if (std::string_view(function.name()) == "aten::_to_copy") ++casts_;
    return nullptr;
  }
  static thread_local int64_t casts_;
  at::CallbackHandle handle_;
};
thread_local int64_t CastCounter::casts_ = 0;

// Under bf16 autocast each micro-step's forward casts every weight its products read again; with a
// WeightCastCache over the micro-steps the later ones cast none of them (the 4 projections of each
// block and the tied output weight), and their gradients are those of casting anew, bit for bit.
// Once the cache ends, a forward casts them again.
TEST(WeightCastCache, CastsTheWeightsOnceForTheMicroStepsItSpans) {
  at::manual_seed(7);
  const ModelConfig config = testing::tiny_config();
  Llama model(config, Kernels::aten);
  const at::Tensor tokens = at::randint(config.vocab_size, {2, 9});
  const auto micro_step = [&] {
    const CastCounter counter;
    at::Tensor loss;
    {
      const AutocastGuard autocast(c10::Device(c10::kCPU), /*enabled=*/true);
      loss = model->loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8));
    }
    loss.backward();
    return counter.casts();
  };
  const auto gradients = [&] {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& parameter : model->parameters())
      grads.push_back(parameter.grad().clone());
    model->zero_grad();
    return grads;
  };

  const int64_t casts = micro_step();
  EXPECT_EQ(micro_step(), casts);
  const std::vector<at::Tensor> cast_anew = gradients();
  int64_t first = 0;
  int64_t second = 0;
  {
    const WeightCastCache cache;
    first = micro_step();
    second = micro_step();
  }
  EXPECT_EQ(first, casts);
  EXPECT_EQ(casts - second, 4 * config.n_layers + 1);
  const std::vector<at::Tensor> cast_once = gradients();
  for (size_t i = 0; i < cast_anew.size(); ++i) EXPECT_TRUE(at::equal(cast_once[i], cast_anew[i]));
  EXPECT_EQ(micro_step(), casts) << "the cache outlived its scope";
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
