// The arithmetic the CUDA kernels run (glue_math.h with ScalarMath, one float per thread), run here
// on the CPU, a row or an element at a time as the kernels take them, against the ATen
// compositions the kernels replace: RMSNorm, RoPE, SwiGLU and cross-entropy, forward and
// backward, in fp32 and from bf16 inputs, at sizes that are no multiple of anything. What a GPU
// adds, the launches and the reductions across threads, tests/gpu/cuda_kernels_test.cpp checks
// there.
#include "model/kernels/glue_math.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "model/kernels/scalar_math.h"
#include "model/layers/feed_forward.h"
#include "model/layers/rms_norm.h"
#include "model/layers/rotary.h"
#include "tests/support/kernel_check.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using glue::ScalarMath;
using testing::ForwardBackward;
using testing::kBf16Tolerance;
using testing::kFp32Tolerance;
using testing::relative_error;
using testing::run_with_grad;

// A contiguous fp32 copy to read and write element by element.
at::Tensor fp32_copy(const at::Tensor& t) { return t.to(at::kFloat).contiguous().clone(); }

// ---- RMSNorm ----

struct NormResult {
  at::Tensor output;
  at::Tensor grad_x;
  at::Tensor grad_weight;
};

// As the CUDA kernels: a row's sum of squares, its rstd, its outputs; backward a row's dot, its
// input gradient (plus grad_residual's, where the add is folded in), and the weight's gradient
// summed over the rows.
template <typename T>
NormResult rms_norm_by_rows(const at::Tensor& x_in, const at::Tensor& weight_in,
                            const at::Tensor& upstream_in, float eps,
                            const at::Tensor& grad_residual = at::Tensor()) {
  const at::Tensor x = fp32_copy(x_in).view({-1, x_in.size(-1)});
  const at::Tensor w = fp32_copy(weight_in);
  const at::Tensor g = fp32_copy(upstream_in).view_as(x);
  const at::Tensor residual =
      grad_residual.defined() ? fp32_copy(grad_residual).view_as(x) : at::zeros_like(x);
  const int64_t rows = x.size(0);
  const int64_t dim = x.size(1);
  at::Tensor out = at::empty_like(x);
  at::Tensor grad_x = at::empty_like(x);
  at::Tensor grad_w = at::zeros_like(w);
  const float* xp = x.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  const float* gp = g.const_data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float squares = 0.0f;
    float dot = 0.0f;
    for (int64_t i = 0; i < dim; ++i) {
      const float v = xp[r * dim + i];
      squares += v * v;
      dot += gp[r * dim + i] * wp[i] * v;
    }
    const float rstd = glue::rms_norm_rstd<ScalarMath>(squares, dim, eps);
    const float scale = glue::rms_norm_backward_scale<ScalarMath>(rstd, dot, dim);
    for (int64_t i = 0; i < dim; ++i) {
      const float v = xp[r * dim + i];
      const float gi = gp[r * dim + i];
      out.data_ptr<float>()[r * dim + i] = glue::rms_norm_output<ScalarMath, T>(v, rstd, wp[i]);
      grad_x.data_ptr<float>()[r * dim + i] = glue::rms_norm_grad_input<ScalarMath>(
          gi, v, wp[i], rstd, scale, residual.const_data_ptr<float>()[r * dim + i]);
      grad_w.data_ptr<float>()[i] += glue::rms_norm_grad_weight_term<ScalarMath, T>(gi, v, rstd);
    }
  }
  return {out.view_as(x_in), grad_x.view_as(x_in).to(x_in.scalar_type()), grad_w};
}

// x [3, 5, 37], rows scaled from 1e-4 to 1e2 so that eps matters for some; a weight away from one.
TEST(GlueMathRMSNorm, MatchesTheComposition) {
  at::manual_seed(500);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = (at::randn({3, 5, 37}) * at::logspace(-4, 2, 5).view({1, 5, 1})).to(dtype);
    const at::Tensor weight = 1.0 + 0.5 * at::randn({37});
    const at::Tensor upstream = at::randn({3, 5, 37});
    const NormResult ours = dtype == at::kFloat
                                ? rms_norm_by_rows<float>(x, weight, upstream, 1e-6f)
                                : rms_norm_by_rows<c10::BFloat16>(x, weight, upstream, 1e-6f);
    const ForwardBackward composed =
        run_with_grad([](const auto& in) { return rms_norm_composition(in[0], in[1], 1e-6); },
                      {x, weight}, upstream);
    const double tolerance = dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance;
    EXPECT_LE(relative_error(ours.output, composed.output), kFp32Tolerance) << dtype;
    EXPECT_LE(relative_error(ours.grad_x, composed.grads[0]), tolerance) << dtype;
    EXPECT_LE(relative_error(ours.grad_weight, composed.grads[1]), kFp32Tolerance) << dtype;
  }
}

// x + delta element by element as the kernels add them, then normalised; backward through both
// the sum (the residual stream's gradient) and the norm. fp32 + fp32, fp32 + bf16 (the
// projection's output under autocast) and bf16 + bf16.
TEST(GlueMathRMSNorm, WithTheResidualAddMatchesTheComposition) {
  at::manual_seed(504);
  for (const auto& [x_dtype, delta_dtype] : testing::kResidualAddDtypes) {
    SCOPED_TRACE(::testing::Message() << "x " << x_dtype << ", delta " << delta_dtype);
    const at::Tensor x =
        (at::randn({3, 5, 37}) * at::logspace(-4, 2, 5).view({1, 5, 1})).to(x_dtype);
    const at::Tensor delta = at::randn({3, 5, 37}).to(delta_dtype);
    const at::Tensor weight = 1.0 + 0.5 * at::randn({37});
    const at::Tensor upstream_sum = at::randn({3, 5, 37});
    const at::Tensor upstream_norm = at::randn({3, 5, 37});

    at::Tensor sum = fp32_copy(x);
    const at::Tensor delta32 = fp32_copy(delta);
    for (int64_t e = 0; e < sum.numel(); ++e) {
      float& element = sum.data_ptr<float>()[e];
      element = x_dtype == at::kFloat
                    ? glue::residual_add<ScalarMath, float>(element, delta32.data_ptr<float>()[e])
                    : glue::residual_add<ScalarMath, c10::BFloat16>(element,
                                                                    delta32.data_ptr<float>()[e]);
    }
    // Rounded to x's dtype by residual_add itself: the composition's sum exactly.
    EXPECT_TRUE(at::equal(sum.flatten(), (x + delta).to(at::kFloat).flatten()));
    sum = sum.to(x_dtype);
    const NormResult ours =
        x_dtype == at::kFloat
            ? rms_norm_by_rows<float>(sum, weight, upstream_norm, 1e-6f, upstream_sum)
            : rms_norm_by_rows<c10::BFloat16>(sum, weight, upstream_norm, 1e-6f, upstream_sum);

    const ForwardBackward composed =
        run_with_grad(testing::composed_add_norm, {x, delta, weight},
                      at::cat({upstream_sum.flatten(), upstream_norm.flatten()}));
    const int64_t n = x.numel();
    const double tolerance = x_dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance;
    EXPECT_LE(relative_error(ours.output.flatten(), composed.output.narrow(0, n, n)),
              kFp32Tolerance);
    EXPECT_LE(relative_error(ours.grad_x, composed.grads[0]), tolerance);
    EXPECT_LE(relative_error(ours.grad_x.to(delta_dtype), composed.grads[1]),
              delta_dtype == x_dtype ? tolerance : testing::kOneBf16Rounding);
    EXPECT_LE(relative_error(ours.grad_weight, composed.grads[2]), kFp32Tolerance);
  }
}

// ---- RoPE ----

// Each pair (i, i + D/2) of each row of x [B, T, H, D]; heads from rotated_heads on copied.
at::Tensor rotate_by_pairs(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t rotated_heads, bool inverse) {
  const at::Tensor x = fp32_copy(x_in);
  at::Tensor out = x.clone();
  const int64_t heads = x.size(2);
  const int64_t dim = x.size(3);
  const int64_t half = dim / 2;
  const at::Tensor c = fp32_copy(cos);
  const at::Tensor s = fp32_copy(sin);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t row = 0; row < x.numel() / dim; ++row) {
    if (row % heads >= rotated_heads) continue;
    const int64_t table = ((row / heads) % (c.numel() / dim)) * dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t at = row * dim + i;
      glue::rotate_pair<ScalarMath>(
          xp[at], xp[at + half], c.const_data_ptr<float>()[table + i],
          s.const_data_ptr<float>()[table + i], c.const_data_ptr<float>()[table + half + i],
          s.const_data_ptr<float>()[table + half + i], inverse, op[at], op[at + half]);
    }
  }
  return out.to(x_in.scalar_type());
}

// Tables [T, D] from a position past 0, and [B, T, D] of each row's own positions; head_dim 38.
TEST(GlueMathRotary, MatchesTheCompositionAndItsInverseIsBackward) {
  at::manual_seed(501);
  Rotary rotary(38, 16, 10000.0);
  const at::Tensor positions = at::tensor({0, 1, 2, 0, 1, 7, 8, 9, 10, 11}, at::kLong).view({2, 5});
  const std::vector<std::pair<at::Tensor, at::Tensor>> tables = {
      {rotary->cos(4, 5), rotary->sin(4, 5)},
      {rotary->cos_at(positions), rotary->sin_at(positions)}};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [cos, sin] : tables) {
      const at::Tensor x = at::randn({2, 5, 4, 38}).to(dtype);
      const at::Tensor upstream = at::randn({2, 5, 4, 38}).to(dtype);
      const ForwardBackward composed = run_with_grad(
          [&](const auto& in) { return rotate_leading_heads(in[0], cos, sin, 3); }, {x}, upstream);
      const double tolerance = dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance;
      EXPECT_LE(relative_error(rotate_by_pairs(x, cos, sin, 3, false), composed.output), tolerance)
          << dtype;
      EXPECT_LE(relative_error(rotate_by_pairs(upstream, cos, sin, 3, true), composed.grads[0]),
                tolerance)
          << dtype;
      EXPECT_TRUE(
          at::equal(rotate_by_pairs(x, cos, sin, 3, false).narrow(2, 3, 1), x.narrow(2, 3, 1)));
    }
  }
}

// ---- SwiGLU ----

// Each element of rows [gate (width), up (width)].
std::pair<at::Tensor, at::Tensor> swiglu_by_elements(const at::Tensor& gate_up_in,
                                                     const at::Tensor& upstream_in) {
  const at::Tensor gate_up = fp32_copy(gate_up_in);
  const at::Tensor grad = fp32_copy(upstream_in);
  const int64_t width = gate_up.size(-1) / 2;
  const int64_t n = grad.numel();
  at::Tensor out = at::empty_like(grad);
  at::Tensor grad_gate_up = at::empty_like(gate_up);
  const float* in = gate_up.const_data_ptr<float>();
  float* dgu = grad_gate_up.data_ptr<float>();
  for (int64_t e = 0; e < n; ++e) {
    const int64_t gate = (e / width) * 2 * width + e % width;
    out.data_ptr<float>()[e] = glue::swiglu_output<ScalarMath>(in[gate], in[gate + width]);
    glue::swiglu_backward<ScalarMath>(grad.const_data_ptr<float>()[e], in[gate], in[gate + width],
                                      dgu[gate], dgu[gate + width]);
  }
  return {out.to(gate_up_in.scalar_type()), grad_gate_up.to(gate_up_in.scalar_type())};
}

// Gates to +-20, where the sigmoid saturates, and rows of an odd width.
TEST(GlueMathSwiGLU, MatchesTheComposition) {
  at::manual_seed(502);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor gate_up =
        at::cat({at::randn({11, 37}) * 5.0, at::randn({11, 37})}, -1).to(dtype);
    const at::Tensor upstream = at::randn({11, 37}).to(dtype);
    const auto [out, grad] = swiglu_by_elements(gate_up, upstream);
    const ForwardBackward composed = run_with_grad(
        [](const auto& in) { return swiglu_composition(in[0]); }, {gate_up}, upstream);
    const double tolerance = dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance;
    EXPECT_LE(relative_error(out, composed.output), tolerance) << dtype;
    EXPECT_LE(relative_error(grad, composed.grads[0]), tolerance) << dtype;
  }
}

// ---- Cross-entropy ----

// As the CUDA kernel: each of `threads` threads gathers the statistics of every threads-th logit
// of a row, and the threads' statistics are merged; the loss is each row's log-sum-exp less its
// target's logit, averaged; the gradient is computed at every logit from the row's statistics.
std::pair<at::Tensor, at::Tensor> cross_entropy_by_rows(const at::Tensor& logits_in,
                                                        const at::Tensor& targets,
                                                        int64_t threads) {
  const at::Tensor logits = fp32_copy(logits_in);
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  at::Tensor grad = at::empty_like(logits);
  const float* lp = logits.const_data_ptr<float>();
  double loss = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    glue::SoftmaxStatistics<ScalarMath> row;
    for (int64_t thread = 0; thread < threads; ++thread) {
      glue::SoftmaxStatistics<ScalarMath> own;
      for (int64_t j = thread; j < vocab; j += threads) own.add(lp[r * vocab + j]);
      row.merge(own);
    }
    const float log_sum = row.log_sum();
    const int64_t target = targets[r].item<int64_t>();
    loss += glue::cross_entropy_loss<ScalarMath>(lp[r * vocab + target], row.max, log_sum);
    for (int64_t j = 0; j < vocab; ++j) {
      grad.data_ptr<float>()[r * vocab + j] = glue::cross_entropy_grad<ScalarMath>(
          lp[r * vocab + j], row.max, log_sum, j == target, 1.0f / static_cast<float>(rows));
    }
  }
  return {at::tensor(loss / static_cast<double>(rows)), grad.to(logits_in.scalar_type())};
}

// Logits to +-40 (a naive sum of exps would overflow fp32 at 89) over a vocabulary of 101, with
// the rows' largest logits falling to different threads; from one thread to more than a row has.
TEST(GlueMathCrossEntropy, MatchesTheCompositionOnAnyNumberOfThreads) {
  at::manual_seed(503);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor logits = (at::randn({9, 101}) * 10.0).clamp(-40, 40).to(dtype);
    const at::Tensor targets = at::randint(101, {9});
    const ForwardBackward composed = run_with_grad(
        [&](const auto& in) { return at::cross_entropy_loss(in[0].to(at::kFloat), targets); },
        {logits}, at::ones({}));
    for (const int64_t threads : {1, 3, 32, 128}) {
      const auto [loss, grad] = cross_entropy_by_rows(logits, targets, threads);
      EXPECT_NEAR(loss.item<double>(), composed.output.item<double>(),
                  1e-5 * std::abs(composed.output.item<double>()))
          << dtype << ", " << threads << " threads";
      EXPECT_LE(relative_error(grad, composed.grads[0]),
                dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance)
          << dtype << ", " << threads << " threads";
    }
  }
}

// Statistics with nothing in them (a thread past the row's end, or one that saw only -inf) merge
// as nothing, both ways.
TEST(GlueMathCrossEntropy, EmptyStatisticsMergeAsNothing) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  glue::SoftmaxStatistics<ScalarMath> empty;
  glue::SoftmaxStatistics<ScalarMath> only_minus_infinity;
  only_minus_infinity.add(-kInf);
  glue::SoftmaxStatistics<ScalarMath> some;
  some.add(-kInf);
  some.add(3.0f);
  some.add(-2.0f);
  const float expected = std::log(std::exp(3.0f) + std::exp(-2.0f));
  for (const auto& nothing : {empty, only_minus_infinity}) {
    glue::SoftmaxStatistics<ScalarMath> merged = nothing;
    merged.merge(some);
    EXPECT_FLOAT_EQ(merged.max + merged.log_sum(), expected);
    glue::SoftmaxStatistics<ScalarMath> other_way = some;
    other_way.merge(nothing);
    EXPECT_FLOAT_EQ(other_way.max + other_way.log_sum(), expected);
  }
}

// As ATen's: a row with -inf logits has a finite loss and a zero gradient there; a row with a NaN
// logit has a NaN loss, wherever the NaN falls among the threads, so the step is skipped as
// non-finite.
TEST(GlueMathCrossEntropy, MinusInfinityCountsForNothingAndNaNSpreads) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  at::Tensor logits = at::randn({2, 40});
  logits[0][3] = -kInf;
  logits[0][4] = -kInf;
  const at::Tensor targets = at::tensor({7, 7}, at::kLong);
  const at::Tensor reference =
      at::cross_entropy_loss(logits.narrow(0, 0, 1), targets.narrow(0, 0, 1));
  for (const int64_t threads : {1, 4, 64}) {
    const auto [loss, grad] =
        cross_entropy_by_rows(logits.narrow(0, 0, 1), targets.narrow(0, 0, 1), threads);
    EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-5) << threads << " threads";
    EXPECT_EQ(grad[0][3].item<float>(), 0.0f);
    for (const int64_t nan_at : {0, 5, 39}) {
      at::Tensor with_nan = logits.narrow(0, 1, 1).clone();
      with_nan[0][nan_at] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(
          cross_entropy_by_rows(with_nan, targets.narrow(0, 1, 1), threads).first.item<double>()))
          << "NaN at " << nan_at << ", " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace mltrain
