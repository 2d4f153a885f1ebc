// RMSNorm and the rotary embedding against their closed forms.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/layers/rms_norm.h"
#include "model/layers/rotary.h"

namespace mltrain {
namespace {

TEST(RMSNorm, WorkedExampleOfTheModelChapter) {
  RMSNorm norm(4, 1e-6, Kernels::fused_cpu);
  const at::Tensor out = norm(at::tensor({2.0f, -2.0f, 2.0f, -2.0f}));
  // rms = sqrt(mean(4, 4, 4, 4) + eps) = sqrt(4 + 1e-6)
  const float expected = static_cast<float>(2.0 / std::sqrt(4.0 + 1e-6));
  EXPECT_TRUE(at::allclose(out, at::tensor({expected, -expected, expected, -expected}), 0, 1e-7));
  EXPECT_NEAR(out[0].item<float>(), 1.0f, 1e-6);
}

TEST(RMSNorm, ScaleInvariant) {
  at::manual_seed(0);
  RMSNorm norm(64, 1e-6, Kernels::fused_cpu);
  const at::Tensor x = at::randn({3, 64});
  EXPECT_TRUE(at::allclose(norm(x * 1000.0), norm(x), 1e-5, 1e-6));
  // The sign of the scale carries through: RMSNorm(a x) = sign(a) RMSNorm(x).
  EXPECT_TRUE(at::allclose(norm(x * -10.0), -norm(x), 1e-5, 1e-6));
}

TEST(RMSNorm, AppliesTheLearnedScalePerChannel) {
  RMSNorm norm(4, 1e-6, Kernels::fused_cpu);
  at::NoGradGuard no_grad;
  norm->weight.copy_(at::tensor({1.0f, 2.0f, 3.0f, 4.0f}));
  const at::Tensor out = norm(at::tensor({2.0f, -2.0f, 2.0f, -2.0f}));
  EXPECT_TRUE(at::allclose(out, at::tensor({1.0f, -2.0f, 3.0f, -4.0f}), 1e-6, 1e-6));
}

TEST(RMSNorm, Bf16InputIsNormalisedInFp32) {
  at::manual_seed(1);
  RMSNorm norm(256, 1e-6, Kernels::fused_cpu);
  const at::Tensor x = (at::randn({8, 256}) * 30).to(at::kBFloat16);
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor in_fp32 = (x32 * at::rsqrt(x32.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16);
  const at::Tensor in_bf16 = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
  const at::Tensor out = norm(x);
  EXPECT_TRUE(at::equal(out.to(at::kBFloat16), in_fp32));
  // The check can tell the two apart: a bf16 computation rounds differently.
  EXPECT_FALSE(at::equal(in_bf16, in_fp32));
}

at::Tensor rotate_at(const at::Tensor& x, const Rotary& rotary, int64_t position) {
  // x [D] -> [1, 1, 1, D] at one position
  return apply_rotary(x.view({1, 1, 1, -1}), rotary->cos(position, 1), rotary->sin(position, 1))
      .flatten();
}

TEST(Rotary, PairsDimensionIWithIPlusHalf) {
  const double theta = 10000.0;
  Rotary rotary(8, 16, theta);
  // Dimension 1 is rotated with dimension 1 + 4 by the angle position * theta^(-2/8).
  const int64_t position = 3;
  const double angle = position * std::pow(theta, -2.0 / 8.0);
  const at::Tensor e1 = at::zeros({8}).index_put_({1}, 1.0);
  const at::Tensor expected = at::zeros({8})
                                  .index_put_({1}, static_cast<float>(std::cos(angle)))
                                  .index_put_({5}, static_cast<float>(std::sin(angle)));
  EXPECT_TRUE(at::allclose(rotate_at(e1, rotary, position), expected, 0, 1e-6));
}

TEST(Rotary, TablesEqualTheClosedForm) {
  const int64_t head_dim = 64;
  Rotary rotary(head_dim, 1024, 10000.0);
  const at::Tensor cos = rotary->cos(1000, 24);  // a slice deep into the table
  const at::Tensor sin = rotary->sin(1000, 24);
  for (int64_t row = 0; row < 24; ++row) {
    for (int64_t i = 0; i < head_dim; ++i) {
      const double angle = (1000 + row) * std::pow(10000.0, -2.0 * (i % (head_dim / 2)) / head_dim);
      ASSERT_NEAR(cos[row][i].item<float>(), std::cos(angle), 1e-6) << row << "," << i;
      ASSERT_NEAR(sin[row][i].item<float>(), std::sin(angle), 1e-6) << row << "," << i;
    }
  }
}

TEST(Rotary, ScoreDependsOnlyOnRelativePosition) {
  at::manual_seed(2);
  const int64_t head_dim = 64;
  Rotary rotary(head_dim, 1024, 10000.0);
  const at::Tensor q = at::randn({head_dim});
  const at::Tensor k = at::randn({head_dim});
  const auto score = [&](int64_t m, int64_t n) {
    return at::dot(rotate_at(q, rotary, m), rotate_at(k, rotary, n)).item<double>();
  };
  const double scale = q.norm().item<double>() * k.norm().item<double>();
  for (int64_t distance : {0, 1, 2, 7, 31, 200}) {
    const double reference = score(distance, 0);
    for (int64_t n :
         {int64_t{1}, int64_t{5}, int64_t{64}, int64_t{333}, int64_t{700}, 1023 - distance}) {
      ASSERT_NEAR(score(n + distance, n), reference, 2e-5 * scale)
          << "m - n = " << distance << ", n = " << n;
    }
  }
  // ... and does depend on it.
  EXPECT_GT(std::abs(score(5, 0) - score(6, 0)), 1e-3 * scale);
}

TEST(Rotary, SlicedTablesRotateLikeTheFullTable) {
  at::manual_seed(3);
  Rotary rotary(16, 64, 10000.0);
  const at::Tensor x = at::randn({2, 40, 3, 16});
  const at::Tensor full = apply_rotary(x, rotary->cos(0, 40), rotary->sin(0, 40));
  const at::Tensor tail =
      apply_rotary(x.narrow(1, 25, 15), rotary->cos(25, 15), rotary->sin(25, 15));
  EXPECT_TRUE(at::equal(tail, full.narrow(1, 25, 15)));
}

}  // namespace
}  // namespace mltrain
