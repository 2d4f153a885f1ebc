// The fused CPU kernels against the ATen compositions they replace: forward values and the
// gradient of every input, in fp32 and bf16, with rows that are not a multiple of the vector width.
#include "model/kernels/cpu_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <string>
#include <utility>
#include <vector>

#include "model/kernels/autocast_region.h"
#include "model/kernels/kernels.h"
#include "model/layers/feed_forward.h"
#include "model/layers/rms_norm.h"
#include "model/layers/rotary.h"
#include "tests/support/kernel_check.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::expect_close;
using testing::ForwardBackward;
using testing::kBf16Tolerance;
using testing::kFp32Tolerance;
using testing::kOneBf16Rounding;
using testing::relative_error;
using testing::run_with_grad;
using testing::to_float;

// The kernels run where ATen runs AVX2 or better (model/kernels/cpu_kernels.cpp); elsewhere, or
// under ATEN_CPU_CAPABILITY=default, the layers run the composition and there is nothing to
// compare.
class RunsWhereTheKernelsDo : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fused_kernels_support(at::kFloat)) GTEST_SKIP() << "no fused kernels on this CPU";
  }
};
using FusedKernel = RunsWhereTheKernelsDo;
using FusedKernelRMSNorm = RunsWhereTheKernelsDo;
using FusedKernelRotary = RunsWhereTheKernelsDo;
using FusedKernelSwiGLU = RunsWhereTheKernelsDo;
using FusedKernelLayers = RunsWhereTheKernelsDo;

std::string node_name(const at::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : std::string("(no grad_fn)");
}

// ---- RMSNorm ----

const auto fused_norm = [](const std::vector<at::Tensor>& in) {
  return fused_rms_norm(in[0], in[1], 1e-6);
};
const auto composed_norm = [](const std::vector<at::Tensor>& in) {
  return rms_norm_composition(in[0], in[1], 1e-6);
};

// x [3, 5, 37] (37: a full vector and a tail), scaled so that eps matters for some rows, and a
// weight away from one so that its gradient differs from the input's.
std::vector<at::Tensor> norm_inputs(at::ScalarType dtype) {
  const at::Tensor x = at::randn({3, 5, 37}) * at::logspace(-4, 2, 5).view({1, 5, 1});
  return {x.to(dtype), 1.0 + 0.5 * at::randn({37})};
}

TEST_F(FusedKernelRMSNorm, MatchesTheCompositionInFp32) {
  at::manual_seed(100);
  const std::vector<at::Tensor> inputs = norm_inputs(at::kFloat);
  const at::Tensor upstream = at::randn({3, 5, 37});
  expect_close(run_with_grad(fused_norm, inputs, upstream),
               run_with_grad(composed_norm, inputs, upstream), kFp32Tolerance);
}

TEST_F(FusedKernelRMSNorm, MatchesTheCompositionInBf16) {
  at::manual_seed(101);
  const std::vector<at::Tensor> inputs = norm_inputs(at::kBFloat16);
  const at::Tensor upstream = at::randn({3, 5, 37});
  const ForwardBackward fused = run_with_grad(fused_norm, inputs, upstream);
  expect_close(fused, run_with_grad(composed_norm, inputs, upstream), kBf16Tolerance);
  // The result is fp32 (bf16 promoted with the fp32 weight), as the composition's.
  EXPECT_EQ(fused.output.scalar_type(), at::kFloat);
  // Computed in fp32: the gradient of x is one rounding away from the fp32 composition's. (The
  // output is rounded before the scale by definition, the weight's gradient is fp32.)
  const ForwardBackward exact = run_with_grad(composed_norm, to_float(inputs), upstream);
  EXPECT_LE(relative_error(fused.grads[0], exact.grads[0]), kOneBf16Rounding);
  EXPECT_LE(relative_error(fused.output, exact.output), kOneBf16Rounding);
}

// Under the CPU's bf16 autocast the norm gives bf16, the composition's fp32 output rounded once,
// as the projection that takes it would cast it (a rounding may fall the other way where the row's
// statistic differs in its last bit); it takes its gradient in bf16, and the inputs' gradients are
// the composition's, which takes the same bf16 gradient, to fp32 rounding.
TEST_F(FusedKernelRMSNorm, GivesBf16UnderBf16Autocast) {
  at::manual_seed(103);
  const std::vector<at::Tensor> inputs = norm_inputs(at::kFloat);
  const at::Tensor upstream = at::randn({3, 5, 37});
  {
    const AutocastGuard autocast(at::Device(at::kCPU), /*enabled=*/true);
    const ForwardBackward fused = run_with_grad(fused_norm, inputs, upstream);
    const ForwardBackward composed = run_with_grad(
        [](const auto& in) { return rms_norm_composition(in[0], in[1], 1e-6).to(at::kBFloat16); },
        inputs, upstream);
    EXPECT_EQ(fused.output.scalar_type(), at::kBFloat16);
    EXPECT_LE(relative_error(fused.output, composed.output), kOneBf16Rounding);
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_LE(relative_error(fused.grads[i], composed.grads[i]), kFp32Tolerance) << "input " << i;
    }
  }
  // Outside autocast, fp32 again.
  EXPECT_EQ(fused_norm(inputs).scalar_type(), at::kFloat);
}

// The weight's gradient sums over rows: blocks of rows in a fixed order, so that 1, 2 or 3
// threads give the same bits. 4000 rows make 125 blocks, enough for every thread to take some.
TEST_F(FusedKernelRMSNorm, GradientsAreBitwiseTheSameOnAnyNumberOfThreads) {
  at::manual_seed(102);
  const std::vector<at::Tensor> inputs = {at::randn({4000, 37}), at::randn({37})};
  const at::Tensor upstream = at::randn({4000, 37});
  const int threads_before = at::get_num_threads();
  std::vector<ForwardBackward> runs;
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    ASSERT_EQ(at::get_num_threads(), threads);
    runs.push_back(run_with_grad(fused_norm, inputs, upstream));
  }
  at::set_num_threads(threads_before);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_TRUE(at::equal(runs[i].output, runs[0].output)) << "run " << i;
    EXPECT_TRUE(at::equal(runs[i].grads[0], runs[0].grads[0])) << "run " << i;
    EXPECT_TRUE(at::equal(runs[i].grads[1], runs[0].grads[1])) << "run " << i;
  }
  // The order is fixed, not lost: the sum is still the composition's to rounding.
  EXPECT_LE(
      relative_error(runs[0].grads[1], run_with_grad(composed_norm, inputs, upstream).grads[1]),
      kFp32Tolerance);
}

// ---- RMSNorm with the residual add folded in ----

const auto fused_add_norm = [](const std::vector<at::Tensor>& in) {
  const auto [sum, normed] = fused_add_rms_norm(in[0], in[1], in[2], 1e-6);
  return testing::joined({sum, normed});
};

// The residual x (rows scaled as norm_inputs'), a delta in delta_dtype read through a transposed
// view, and a weight: x [3, 5, 37].
std::vector<at::Tensor> add_norm_inputs(at::ScalarType x_dtype, at::ScalarType delta_dtype) {
  std::vector<at::Tensor> inputs = norm_inputs(x_dtype);
  const at::Tensor delta = at::randn({3, 37, 5}).to(delta_dtype).transpose(1, 2);
  return {inputs[0], delta, inputs[1]};
}

// The sum and the norm, and the gradients of x, delta and the weight, through both outputs: fp32,
// the bf16 delta that a projection gives under autocast, and bf16 throughout. The norm is
// fused_rms_norm's of the sum bit for bit: its statistic is taken of the sum rounded to x's dtype.
TEST_F(FusedKernelRMSNorm, WithTheResidualAddMatchesTheComposition) {
  at::manual_seed(104);
  for (const auto& [x_dtype, delta_dtype] : testing::kResidualAddDtypes) {
    SCOPED_TRACE(::testing::Message() << "x " << x_dtype << ", delta " << delta_dtype);
    const std::vector<at::Tensor> inputs = add_norm_inputs(x_dtype, delta_dtype);
    ASSERT_FALSE(inputs[1].is_contiguous());
    const at::Tensor upstream = at::randn({2 * inputs[0].numel()});
    testing::expect_add_norm_close(run_with_grad(fused_add_norm, inputs, upstream),
                                   run_with_grad(testing::composed_add_norm, inputs, upstream),
                                   x_dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance);
    const auto [sum, normed] = fused_add_rms_norm(inputs[0], inputs[1], inputs[2], 1e-6);
    EXPECT_EQ(sum.scalar_type(), x_dtype);
    EXPECT_TRUE(at::equal(normed, fused_rms_norm(inputs[0] + inputs[1], inputs[2], 1e-6)));
  }
}

// Under autocast the residual stays fp32 and the norm gives bf16, as fused_rms_norm does.
TEST_F(FusedKernelRMSNorm, WithTheResidualAddGivesBf16UnderBf16Autocast) {
  at::manual_seed(105);
  const std::vector<at::Tensor> inputs = add_norm_inputs(at::kFloat, at::kBFloat16);
  const AutocastGuard autocast(at::Device(at::kCPU), /*enabled=*/true);
  const auto [sum, normed] = fused_add_rms_norm(inputs[0], inputs[1], inputs[2], 1e-6);
  EXPECT_EQ(sum.scalar_type(), at::kFloat);
  EXPECT_EQ(normed.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(normed, fused_rms_norm(inputs[0] + inputs[1], inputs[2], 1e-6)));
}

// No rows: empty outputs and gradients, and a zero gradient for the weight.
TEST_F(FusedKernelRMSNorm, WithTheResidualAddTakesNoRows) {
  const std::vector<at::Tensor> inputs = {at::randn({0, 37}), at::randn({0, 37}), at::randn({37})};
  const ForwardBackward run = run_with_grad(fused_add_norm, inputs, at::randn({0}));
  EXPECT_EQ(run.output.numel(), 0);
  EXPECT_EQ(run.grads[0].sizes(), inputs[0].sizes());
  EXPECT_EQ(run.grads[1].sizes(), inputs[1].sizes());
  EXPECT_TRUE(at::equal(run.grads[2], at::zeros({37})));
}

// ---- RoPE ----

struct RotaryCase {
  at::Tensor cos;
  at::Tensor sin;
};

// head_dim 74: halves of 37. Rows 4.. of the tables, as a forward pass after a cached prefix.
RotaryCase rotary_tables() {
  Rotary rotary(74, 16, 10000.0);
  return {rotary->cos(4, 5), rotary->sin(4, 5)};
}

TEST_F(FusedKernelRotary, MatchesTheCompositionInFp32) {
  at::manual_seed(200);
  const RotaryCase t = rotary_tables();
  const std::vector<at::Tensor> inputs = {at::randn({2, 5, 3, 74})};
  const at::Tensor upstream = at::randn({2, 5, 3, 74});
  expect_close(run_with_grad([&](const auto& in) { return fused_rotary(in[0], t.cos, t.sin); },
                             inputs, upstream),
               run_with_grad([&](const auto& in) { return apply_rotary(in[0], t.cos, t.sin); },
                             inputs, upstream),
               kFp32Tolerance);
}

TEST_F(FusedKernelRotary, MatchesTheCompositionInBf16) {
  at::manual_seed(201);
  const RotaryCase t = rotary_tables();
  const std::vector<at::Tensor> inputs = {at::randn({2, 5, 3, 74}).to(at::kBFloat16)};
  const at::Tensor upstream = at::randn({2, 5, 3, 74});
  const auto fused = [&](const auto& in) { return fused_rotary(in[0], t.cos, t.sin); };
  const auto composed = [&](const auto& in) { return apply_rotary(in[0], t.cos, t.sin); };
  const ForwardBackward run = run_with_grad(fused, inputs, upstream);
  expect_close(run, run_with_grad(composed, inputs, upstream), kBf16Tolerance);
  // With fp32 tables (the composition rounds them to bf16 first): one rounding from exact.
  const ForwardBackward exact =
      run_with_grad(composed, to_float(inputs), upstream.to(at::kBFloat16));
  EXPECT_LE(relative_error(run.output, exact.output), kOneBf16Rounding);
  EXPECT_LE(relative_error(run.grads[0], exact.grads[0]), kOneBf16Rounding);
}

// With document masking each row has its own positions, restarting at each document: tables
// [B, T, D], each row different.
TEST_F(FusedKernelRotary, TakesTablesPerRow) {
  at::manual_seed(203);
  Rotary rotary(74, 16, 10000.0);
  const at::Tensor positions = at::tensor({0, 1, 2, 0, 1, 7, 8, 9, 10, 11}, at::kLong).view({2, 5});
  const at::Tensor cos = rotary->cos_at(positions);
  const at::Tensor sin = rotary->sin_at(positions);
  const std::vector<at::Tensor> inputs = {at::randn({2, 5, 3, 74})};
  const at::Tensor upstream = at::randn({2, 5, 3, 74});
  expect_close(run_with_grad([&](const auto& in) { return fused_rotary(in[0], cos, sin); }, inputs,
                             upstream),
               run_with_grad([&](const auto& in) { return apply_rotary(in[0], cos, sin); }, inputs,
                             upstream),
               kFp32Tolerance);
  // Row 1 at positions 7..11 rotates as shared tables of those positions do.
  const at::Tensor row = inputs[0].narrow(0, 1, 1);
  EXPECT_LE(relative_error(fused_rotary(row, rotary->cos(7, 5), rotary->sin(7, 5)),
                           fused_rotary(inputs[0], cos, sin).narrow(0, 1, 1)),
            kFp32Tolerance);
}

// q and k come from views of a linear's output; a transposed view must rotate the same.
TEST_F(FusedKernelRotary, TakesAStridedInput) {
  at::manual_seed(202);
  const RotaryCase t = rotary_tables();
  const at::Tensor x = at::randn({2, 3, 5, 74}).transpose(1, 2);  // [2, 5, 3, 74], not contiguous
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_LE(relative_error(fused_rotary(x, t.cos, t.sin), apply_rotary(x, t.cos, t.sin)),
            kFp32Tolerance);
}

// The attention rotates its queries and keys, and copies its values, in one pass: heads
// [0, rotated_heads) rotate as apply_rotary rotates them, and the rest, with their gradients, pass
// through bit for bit.
TEST_F(FusedKernelRotary, RotatesTheLeadingHeadsAndCopiesTheRest) {
  at::manual_seed(204);
  const RotaryCase t = rotary_tables();
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::vector<at::Tensor> inputs = {at::randn({2, 5, 5, 74}).to(dtype)};
    const at::Tensor upstream = at::randn({2, 5, 5, 74}).to(dtype);
    const ForwardBackward fused = run_with_grad(
        [&](const auto& in) { return fused_rotary(in[0], t.cos, t.sin, 3); }, inputs, upstream);
    expect_close(
        fused,
        run_with_grad([&](const auto& in) { return rotate_leading_heads(in[0], t.cos, t.sin, 3); },
                      inputs, upstream),
        dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance);
    EXPECT_LE(relative_error(fused.output.narrow(2, 0, 3),
                             fused_rotary(inputs[0].narrow(2, 0, 3), t.cos, t.sin)),
              kFp32Tolerance);
    EXPECT_TRUE(at::equal(fused.output.narrow(2, 3, 2), inputs[0].narrow(2, 3, 2)));
    EXPECT_TRUE(at::equal(fused.grads[0].narrow(2, 3, 2), upstream.narrow(2, 3, 2)));
  }
  // The composition, against apply_rotary of the leading heads alone.
  const at::Tensor x = at::randn({2, 5, 5, 74});
  const at::Tensor composed = rotate_leading_heads(x, t.cos, t.sin, 3);
  EXPECT_TRUE(at::equal(composed.narrow(2, 0, 3), apply_rotary(x.narrow(2, 0, 3), t.cos, t.sin)));
  EXPECT_TRUE(at::equal(composed.narrow(2, 3, 2), x.narrow(2, 3, 2)));
}

// ---- SwiGLU ----

const auto fused_ffn_glue = [](const std::vector<at::Tensor>& in) { return fused_swiglu(in[0]); };
const auto composed_ffn_glue = [](const std::vector<at::Tensor>& in) {
  return swiglu_composition(in[0]);
};

// gate and up of 3 * 5 rows of 37 values, side by side in one [3, 5, 74] tensor: rows of an odd
// width, so that each row ends in a partial vector. A gate scale of 5 reaches +-20, where the
// sigmoid saturates; of 1.5, where it does not, so that each rounding shows in the result.
std::vector<at::Tensor> swiglu_inputs(at::ScalarType dtype, double gate_scale) {
  return {at::cat({at::randn({3, 5, 37}) * gate_scale, at::randn({3, 5, 37})}, -1).to(dtype)};
}

TEST_F(FusedKernelSwiGLU, MatchesTheCompositionInFp32) {
  at::manual_seed(300);
  const std::vector<at::Tensor> inputs = swiglu_inputs(at::kFloat, 5.0);
  const at::Tensor upstream = at::randn({3, 5, 37});
  expect_close(run_with_grad(fused_ffn_glue, inputs, upstream),
               run_with_grad(composed_ffn_glue, inputs, upstream), kFp32Tolerance);
}

TEST_F(FusedKernelSwiGLU, MatchesTheCompositionInBf16) {
  at::manual_seed(301);
  const std::vector<at::Tensor> inputs = swiglu_inputs(at::kBFloat16, 1.5);
  const at::Tensor upstream = at::randn({3, 5, 37});
  const ForwardBackward fused = run_with_grad(fused_ffn_glue, inputs, upstream);
  expect_close(fused, run_with_grad(composed_ffn_glue, inputs, upstream), kBf16Tolerance);
  const ForwardBackward exact =
      run_with_grad(composed_ffn_glue, to_float(inputs), upstream.to(at::kBFloat16));
  EXPECT_LE(relative_error(fused.output, exact.output), kOneBf16Rounding);
  EXPECT_LE(relative_error(fused.grads[0], exact.grads[0]), kOneBf16Rounding);
}

// Rows split across threads at any boundary give the same values as on one thread.
TEST_F(FusedKernelSwiGLU, IsTheSameOnAnyNumberOfThreads) {
  at::manual_seed(302);
  const std::vector<at::Tensor> inputs = {at::randn({1000, 602})};
  const at::Tensor upstream = at::randn({1000, 301});
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  const ForwardBackward one = run_with_grad(fused_ffn_glue, inputs, upstream);
  at::set_num_threads(3);
  const ForwardBackward three = run_with_grad(fused_ffn_glue, inputs, upstream);
  at::set_num_threads(threads_before);
  EXPECT_TRUE(at::equal(one.output, three.output));
  EXPECT_TRUE(at::equal(one.grads[0], three.grads[0]));
}

// ---- all three ----

TEST_F(FusedKernel, RecordsAGraphOnlyWhenAGradientIsWanted) {
  const RotaryCase t = rotary_tables();
  const at::Tensor x = at::randn({2, 5, 3, 74}).requires_grad_();
  const at::Tensor w = at::ones({74}).requires_grad_();
  EXPECT_TRUE(fused_rms_norm(x, w, 1e-6).requires_grad());
  EXPECT_TRUE(fused_rotary(x, t.cos, t.sin).requires_grad());
  EXPECT_TRUE(fused_swiglu(x).requires_grad());
  at::NoGradGuard no_grad;
  EXPECT_EQ(node_name(fused_rms_norm(x, w, 1e-6)), "(no grad_fn)");
  EXPECT_EQ(node_name(fused_rotary(x, t.cos, t.sin)), "(no grad_fn)");
  EXPECT_EQ(node_name(fused_swiglu(x)), "(no grad_fn)");
}

TEST_F(FusedKernel, RefusesWhatItDoesNotTake) {
  const RotaryCase t = rotary_tables();
  const at::Tensor x = at::randn({2, 5, 3, 74});
  EXPECT_THROW(fused_rms_norm(x.to(at::kDouble), at::ones({74}), 1e-6), c10::Error);
  EXPECT_THROW(fused_rms_norm(x.to(at::kHalf), at::ones({74}), 1e-6), c10::Error);
  EXPECT_THROW(fused_rms_norm(x, at::ones({73}), 1e-6), c10::Error);
  EXPECT_THROW(fused_rms_norm(x, at::ones({74}, at::kBFloat16), 1e-6), c10::Error);
  EXPECT_THROW(fused_rotary(x.flatten(2), t.cos, t.sin), c10::Error);
  EXPECT_THROW(fused_rotary(x, t.cos.narrow(0, 0, 4), t.sin.narrow(0, 0, 4)), c10::Error);
  const at::Tensor three_rows_cos = t.cos.unsqueeze(0).expand({x.size(0) + 1, -1, -1});
  const at::Tensor three_rows_sin = t.sin.unsqueeze(0).expand({x.size(0) + 1, -1, -1});
  EXPECT_THROW(fused_rotary(x, three_rows_cos, three_rows_sin), c10::Error);
  EXPECT_THROW(fused_rotary(x.narrow(3, 0, 73), t.cos.narrow(1, 0, 73), t.sin.narrow(1, 0, 73)),
               c10::Error);
  EXPECT_THROW(fused_rotary(x, t.cos.clone().requires_grad_(), t.sin), c10::Error);
  EXPECT_THROW(fused_rotary(x, t.cos, t.sin, 4), c10::Error);
  EXPECT_THROW(fused_rotary(x, t.cos, t.sin, -1), c10::Error);
  EXPECT_THROW(fused_swiglu(x.narrow(3, 0, 73)), c10::Error);
  EXPECT_THROW(fused_swiglu(x.to(at::kDouble)), c10::Error);
  const at::Tensor w = at::ones({74});
  // bf16 + fp32 is fp32: the sum would not keep the residual's dtype.
  EXPECT_THROW(fused_add_rms_norm(x.to(at::kBFloat16), x, w, 1e-6), c10::Error);
  EXPECT_THROW(fused_add_rms_norm(x, x.narrow(0, 0, 1), w, 1e-6), c10::Error);
  EXPECT_THROW(fused_add_rms_norm(x, x.to(at::kDouble), w, 1e-6), c10::Error);
}

// Layers built with the fused CPU kernels run them, and the composition for dtypes the kernels do
// not take; layers built with the aten kernels, side by side, run the composition, bit for bit.
TEST_F(FusedKernelLayers, LayersRunTheKernelsTheyAreBuiltWith) {
  at::manual_seed(400);
  RMSNorm norm(37, 1e-6, Kernels::fused_cpu);
  RMSNorm aten_norm(37, 1e-6, Kernels::aten);
  FeedForward aten_ffn(37, 53, Kernels::aten);
  const RotaryCase t = rotary_tables();
  const at::Tensor x = at::randn({2, 5, 37}).requires_grad_();
  const at::Tensor heads = at::randn({2, 5, 3, 74}).requires_grad_();
  const at::Tensor gate_up = at::randn({2, 5, 106}).requires_grad_();

  EXPECT_NE(node_name(norm(x)).find("RMSNormFunction"), std::string::npos) << node_name(norm(x));
  EXPECT_NE(
      node_name(rotate_heads(heads, t.cos, t.sin, Kernels::fused_cpu, 2)).find("RotaryFunction"),
      std::string::npos);
  EXPECT_NE(node_name(swiglu(gate_up, Kernels::fused_cpu)).find("SwiGLUFunction"),
            std::string::npos);
  EXPECT_EQ(node_name(norm(x.to(at::kDouble))).find("RMSNormFunction"), std::string::npos);
  const at::Tensor delta = at::randn({2, 5, 37});
  EXPECT_NE(node_name(norm->add_then_forward(x, delta).second).find("AddRMSNormFunction"),
            std::string::npos);
  // bf16 + fp32 would change the residual's dtype: the add, then the fused norm alone.
  const auto [bf16_sum, bf16_normed] = norm->add_then_forward(x.to(at::kBFloat16), delta);
  EXPECT_EQ(node_name(bf16_sum), node_name(x.to(at::kBFloat16) + delta));
  EXPECT_EQ(node_name(bf16_normed), node_name(norm(x)));

  EXPECT_TRUE(at::equal(aten_norm(x), rms_norm_composition(x, aten_norm->weight, 1e-6)));
  EXPECT_EQ(node_name(aten_norm(x)), node_name(rms_norm_composition(x, aten_norm->weight, 1e-6)));
  const auto [aten_sum, aten_normed] = aten_norm->add_then_forward(x, delta);
  EXPECT_EQ(node_name(aten_sum), node_name(x + delta));
  EXPECT_TRUE(at::equal(aten_normed, rms_norm_composition(x + delta, aten_norm->weight, 1e-6)));
  const at::Tensor rotated = rotate_heads(heads, t.cos, t.sin, Kernels::aten, 2);
  EXPECT_TRUE(at::equal(rotated, rotate_leading_heads(heads, t.cos, t.sin, 2)));
  EXPECT_EQ(node_name(rotated), node_name(rotate_leading_heads(heads, t.cos, t.sin, 2)));
  EXPECT_TRUE(at::equal(swiglu(gate_up, Kernels::aten), swiglu_composition(gate_up)));
  EXPECT_EQ(node_name(swiglu(gate_up, Kernels::aten)), node_name(swiglu_composition(gate_up)));
  // Within a rounding: the CPU's GEMM may round differently for operands at other addresses.
  EXPECT_TRUE(
      at::allclose(aten_ffn(x),
                   at::linear(swiglu_composition(at::linear(x, aten_ffn->w_gate_up->weight)),
                              aten_ffn->w_down->weight),
                   1e-6, 1e-7));
}

}  // namespace
}  // namespace mltrain
