// mltrain's CUDA kernels against the ATen compositions they replace, on the GPU: forward values
// and the gradient of every input, in fp32 and bf16, at odd sizes and from inputs that are not
// contiguous; RMSNorm with the residual add folded in; RMSNorm under autocast, which gives the
// autocast dtype; the weight gradient's sum repeatable bit for bit; and the model built with them
// against the model built with ATen's. train.kernels: auto keeps the ATen layers on CUDA until
// these have passed on a GPU.
#include "model/kernels/cuda_kernels.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "model/kernels/autocast_region.h"
#include "model/layers/feed_forward.h"
#include "model/layers/linear.h"
#include "model/layers/llama.h"
#include "model/layers/rms_norm.h"
#include "model/layers/rotary.h"
#include "tests/model/tiny_config.h"
#include "tests/support/kernel_check.h"
#include "tests/support/test_support.h"
#include "trainer/run/train_step.h"

namespace mltrain {
namespace {

using testing::expect_close;
using testing::ForwardBackward;
using testing::kBf16Tolerance;
using testing::kFp32Tolerance;
using testing::kOneBf16Rounding;
using testing::relative_error;
using testing::run_with_grad;

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    ASSERT_TRUE(cuda_kernels_built());
  }
  static double tolerance(at::ScalarType dtype) {
    return dtype == at::kFloat ? kFp32Tolerance : kBf16Tolerance;
  }
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);
};

// ---- RMSNorm ----

const auto cuda_norm = [](const std::vector<at::Tensor>& in) {
  return cuda_rms_norm(in[0], in[1], 1e-6);
};
const auto composed_norm = [](const std::vector<at::Tensor>& in) {
  return rms_norm_composition(in[0], in[1], 1e-6);
};

// x [3, 5, 37], rows scaled from 1e-4 to 1e2 so that eps matters for some, as a transposed view
// of [5, 3, 37]; a weight away from one.
TEST_F(CudaKernels, RMSNormMatchesTheComposition) {
  at::manual_seed(600);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x =
        (at::randn({5, 3, 37}, cuda) * at::logspace(-4, 2, 5, 10.0, cuda).view({5, 1, 1}))
            .to(dtype)
            .transpose(0, 1);
    ASSERT_FALSE(x.is_contiguous());
    const std::vector<at::Tensor> inputs = {x, 1.0 + 0.5 * at::randn({37}, cuda)};
    const at::Tensor upstream = at::randn({3, 5, 37}, cuda);
    const ForwardBackward fused = run_with_grad(cuda_norm, inputs, upstream);
    expect_close(fused, run_with_grad(composed_norm, inputs, upstream), tolerance(dtype));
    EXPECT_EQ(fused.output.scalar_type(), at::kFloat);
  }
}

// Under autocast the norm's output is what the next projection would cast it to: bf16, the
// composition's fp32 output rounded once (a rounding may fall the other way where the row's
// statistic differs in its last bit); it takes its gradient in bf16, and the inputs' gradients are
// the composition's, which takes the same bf16 gradient, to fp32 rounding.
TEST_F(CudaKernels, RMSNormGivesTheAutocastDtypeUnderAutocast) {
  at::manual_seed(601);
  const std::vector<at::Tensor> inputs = {at::randn({7, 131}, cuda), at::randn({131}, cuda)};
  const at::Tensor upstream = at::randn({7, 131}, cuda);
  const AutocastGuard autocast(at::Device(at::kCUDA), /*enabled=*/true);
  const ForwardBackward fused = run_with_grad(cuda_norm, inputs, upstream);
  const ForwardBackward composed = run_with_grad(
      [](const auto& in) { return rms_norm_composition(in[0], in[1], 1e-6).to(at::kBFloat16); },
      inputs, upstream);
  EXPECT_EQ(fused.output.scalar_type(), at::kBFloat16);
  EXPECT_LE(relative_error(fused.output, composed.output), kOneBf16Rounding);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_LE(relative_error(fused.grads[i], composed.grads[i]), kFp32Tolerance) << "input " << i;
  }
}

// The weight's gradient sums over rows in fixed blocks in a fixed order: the same bits every run.
TEST_F(CudaKernels, RMSNormGradientsRepeatBitForBit) {
  at::manual_seed(602);
  const std::vector<at::Tensor> inputs = {at::randn({4000, 515}, cuda), at::randn({515}, cuda)};
  const at::Tensor upstream = at::randn({4000, 515}, cuda);
  const ForwardBackward first = run_with_grad(cuda_norm, inputs, upstream);
  const ForwardBackward second = run_with_grad(cuda_norm, inputs, upstream);
  EXPECT_TRUE(at::equal(first.output, second.output));
  EXPECT_TRUE(at::equal(first.grads[0], second.grads[0]));
  EXPECT_TRUE(at::equal(first.grads[1], second.grads[1]));
  EXPECT_LE(relative_error(first.grads[1], run_with_grad(composed_norm, inputs, upstream).grads[1]),
            kFp32Tolerance);
}

// ---- RMSNorm with the residual add folded in ----

// The sum and the norm through both outputs, and the gradients of x, delta (a transposed view) and
// the weight: fp32, the bf16 delta a projection gives under autocast, and bf16 throughout; then
// under autocast, where the sum stays fp32 and the norm gives bf16.
TEST_F(CudaKernels, RMSNormWithTheResidualAddMatchesTheComposition) {
  at::manual_seed(603);
  const auto fused = [](const std::vector<at::Tensor>& in) {
    const auto [sum, normed] = cuda_add_rms_norm(in[0], in[1], in[2], 1e-6);
    return testing::joined({sum, normed});
  };
  for (const auto& [x_dtype, delta_dtype] : testing::kResidualAddDtypes) {
    SCOPED_TRACE(::testing::Message() << "x " << x_dtype << ", delta " << delta_dtype);
    const std::vector<at::Tensor> inputs = {
        (at::randn({3, 5, 515}, cuda) * at::logspace(-4, 2, 5, 10.0, cuda).view({1, 5, 1}))
            .to(x_dtype),
        at::randn({3, 515, 5}, cuda).to(delta_dtype).transpose(1, 2),
        1.0 + 0.5 * at::randn({515}, cuda)};
    const at::Tensor upstream = at::randn({2 * inputs[0].numel()}, cuda);
    testing::expect_add_norm_close(run_with_grad(fused, inputs, upstream),
                                   run_with_grad(testing::composed_add_norm, inputs, upstream),
                                   tolerance(x_dtype));
    // Its statistic taken of the sum rounded to x's dtype, the norm is cuda_rms_norm's of the sum.
    const auto [sum, normed] = cuda_add_rms_norm(inputs[0], inputs[1], inputs[2], 1e-6);
    EXPECT_TRUE(at::equal(normed, cuda_rms_norm(inputs[0] + inputs[1], inputs[2], 1e-6)));
    EXPECT_EQ(normed.scalar_type(), at::kFloat);
  }
  const at::Tensor x = at::randn({7, 131}, cuda);
  const at::Tensor delta = at::randn({7, 131}, cuda).to(at::kBFloat16);
  const at::Tensor weight = at::randn({131}, cuda);
  const AutocastGuard autocast(at::Device(at::kCUDA), /*enabled=*/true);
  const auto [sum, normed] = cuda_add_rms_norm(x, delta, weight, 1e-6);
  EXPECT_EQ(sum.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(normed, cuda_rms_norm(x + delta, weight, 1e-6)));
}

// ---- RoPE ----

// The attention's fused projection [B, T, Hq + 2 Hkv, D], its leading heads rotated and the rest
// copied, with tables shared by the batch or each row's own; x a strided view; head_dim 74.
TEST_F(CudaKernels, RotaryMatchesTheComposition) {
  at::manual_seed(603);
  Rotary rotary(74, 16, 10000.0);
  rotary->to(at::kCUDA);
  const at::Tensor positions =
      at::tensor({0, 1, 2, 0, 1, 7, 8, 9, 10, 11}, at::kLong).view({2, 5}).to(at::kCUDA);
  const std::vector<std::pair<at::Tensor, at::Tensor>> tables = {
      {rotary->cos(4, 5), rotary->sin(4, 5)},
      {rotary->cos_at(positions), rotary->sin_at(positions)}};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [cos, sin] : tables) {
      const at::Tensor x =
          at::randn({2, 5, 5, 74}, cuda).to(dtype).transpose(1, 2).contiguous().transpose(1, 2);
      ASSERT_FALSE(x.is_contiguous());
      const at::Tensor upstream = at::randn({2, 5, 5, 74}, cuda);
      const ForwardBackward fused = run_with_grad(
          [&](const auto& in) { return cuda_rotary(in[0], cos, sin, 3); }, {x}, upstream);
      // The composition with the tables in x's dtype, as the ATen layers take them.
      const ForwardBackward composed = run_with_grad(
          [&](const auto& in) {
            return rotate_leading_heads(in[0], cos.to(dtype), sin.to(dtype), 3);
          },
          {x}, upstream);
      expect_close(fused, composed, tolerance(dtype));
      EXPECT_TRUE(at::equal(fused.output.narrow(2, 3, 2), x.narrow(2, 3, 2)));
      EXPECT_TRUE(at::equal(fused.grads[0].narrow(2, 3, 2), upstream.to(dtype).narrow(2, 3, 2)));
    }
  }
}

// ---- SwiGLU ----

// gate and up of width 37 (odd), gates to +-20 where the sigmoid saturates, as a slice of a wider
// tensor (not contiguous).
TEST_F(CudaKernels, SwiGLUMatchesTheComposition) {
  at::manual_seed(604);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // The leaf is the wide tensor, so that the kernel is handed the slice (run_with_grad's copy
    // of a slice would be contiguous).
    const at::Tensor wide =
        at::cat({at::randn({3, 5, 37}, cuda) * 5.0, at::randn({3, 5, 40}, cuda)}, -1).to(dtype);
    const at::Tensor upstream = at::randn({3, 5, 37}, cuda);
    const auto gate_up = [](const at::Tensor& leaf) {
      const at::Tensor slice = leaf.narrow(-1, 0, 74);
      EXPECT_FALSE(slice.is_contiguous());
      return slice;
    };
    expect_close(run_with_grad([&](const auto& in) { return cuda_swiglu(gate_up(in[0])); }, {wide},
                               upstream),
                 run_with_grad([&](const auto& in) { return swiglu_composition(gate_up(in[0])); },
                               {wide}, upstream),
                 tolerance(dtype));
  }
}

// ---- Cross-entropy ----

// Logits [37, 1001] to +-40 as a transposed view, against the composition of the loss over fp32
// logits, as next_token_loss computes it. The gradient comes in the logits' dtype.
TEST_F(CudaKernels, CrossEntropyMatchesTheComposition) {
  at::manual_seed(605);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor logits = (at::randn({1001, 37}, cuda) * 10.0).clamp(-40, 40).to(dtype).t();
    ASSERT_FALSE(logits.is_contiguous());
    const at::Tensor targets = at::randint(1001, {37}, cuda.dtype(at::kLong));
    const at::Tensor upstream = at::full({}, 0.5, cuda);
    const ForwardBackward fused = run_with_grad(
        [&](const auto& in) { return cuda_cross_entropy(in[0], targets); }, {logits}, upstream);
    const ForwardBackward composed = run_with_grad(
        [&](const auto& in) { return at::cross_entropy_loss(in[0].to(at::kFloat), targets); },
        {logits}, upstream);
    EXPECT_EQ(fused.output.scalar_type(), at::kFloat);
    EXPECT_NEAR(fused.output.item<double>(), composed.output.item<double>(),
                1e-5 * std::abs(composed.output.item<double>()));
    ASSERT_EQ(fused.grads[0].scalar_type(), dtype);
    EXPECT_LE(relative_error(fused.grads[0], composed.grads[0]), tolerance(dtype));
  }
}

// A vocabulary smaller than a warp, rows with -inf logits (finite loss, zero gradient there, as
// ATen's) and a row with a NaN logit, which makes the loss NaN so that the step is skipped.
TEST_F(CudaKernels, CrossEntropyTakesSmallVocabulariesInfinitiesAndNaN) {
  at::manual_seed(606);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  at::Tensor logits = at::randn({6, 13}, cuda);
  logits.select(0, 1).fill_(-kInf);
  logits[1][4] = 2.0f;
  logits.select(1, 9).fill_(-kInf);
  const at::Tensor targets = at::tensor({0, 4, 12, 3, 5, 8}, at::kLong).to(at::kCUDA);
  const ForwardBackward fused =
      run_with_grad([&](const auto& in) { return cuda_cross_entropy(in[0], targets); }, {logits},
                    at::ones({}, cuda));
  const ForwardBackward composed =
      run_with_grad([&](const auto& in) { return at::cross_entropy_loss(in[0], targets); },
                    {logits}, at::ones({}, cuda));
  EXPECT_NEAR(fused.output.item<double>(), composed.output.item<double>(), 1e-5);
  EXPECT_LE(relative_error(fused.grads[0], composed.grads[0]), kFp32Tolerance);
  EXPECT_TRUE(at::all(fused.grads[0].select(1, 9) == 0).item<bool>());
  logits[3][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(cuda_cross_entropy(logits, targets).item<double>()));
}

// Asked to, backward writes the gradient over the logits (the model's loss asks): the same
// gradient, in the logits' memory, and a second backward through them is refused; never over a
// leaf. Not asked, the caller's logits are left as they were.
TEST_F(CudaKernels, CrossEntropyWritesItsGradientOverTheLogitsOnlyWhenAsked) {
  at::manual_seed(609);
  const at::Tensor leaf = at::randn({37, 1001}, cuda).requires_grad_();
  const at::Tensor targets = at::randint(1001, {37}, cuda.dtype(at::kLong));
  const at::Tensor expected =
      torch::autograd::grad({at::cross_entropy_loss(leaf, targets)}, {leaf})[0];
  for (const bool overwrite : {false, true}) {
    SCOPED_TRACE(overwrite ? "overwritten" : "kept");
    const at::Tensor logits = leaf * 1.0f;  // a non-leaf, as the output projection's
    const at::Tensor before = logits.detach().clone();
    const at::Tensor loss = cuda_cross_entropy(logits, targets, overwrite);
    const at::Tensor grad = torch::autograd::grad({loss}, {logits}, {}, /*retain_graph=*/true)[0];
    EXPECT_LE(relative_error(grad, expected), kFp32Tolerance);
    EXPECT_EQ(grad.data_ptr() == logits.data_ptr(), overwrite);
    EXPECT_EQ(at::equal(logits.detach(), before), !overwrite);
    EXPECT_FALSE(grad.requires_grad());
    if (overwrite) {
      EXPECT_THROW(torch::autograd::grad({loss}, {logits}), c10::Error);
    } else {
      EXPECT_LE(relative_error(torch::autograd::grad({loss}, {logits})[0], expected),
                kFp32Tolerance);
    }
  }
  // Never over a leaf, which its caller holds, nor over a view of one.
  EXPECT_THROW(cuda_cross_entropy(leaf, targets, /*gradient_overwrites_logits=*/true), c10::Error);
  EXPECT_THROW(cuda_cross_entropy(leaf.view({37, 1001}), targets, true), c10::Error);
}

// ---- sizes at the grid's limits ----

// Past 65,535 rows (CUDA's limit on a grid's y and z) the kernels stride: SwiGLU's rows, RoPE's
// sequences and the norm's weight-gradient partials (a block of 64 rows each). Each case goes a few
// rows or sequences past the limit, where a kernel that did not stride would leave its output
// unwritten; the norm's last rows take a gradient 1e4 times the others', so that the weight
// gradient is mostly theirs.
TEST_F(CudaKernels, KernelsStridePastTheGridLimit) {
  at::manual_seed(610);
  constexpr int64_t kPastTheLimit = 65535 + 3;
  const at::Tensor gate_up = at::randn({kPastTheLimit, 18}, cuda);
  const at::Tensor swiglu_upstream = at::randn({kPastTheLimit, 9}, cuda);
  expect_close(
      run_with_grad([](const auto& in) { return cuda_swiglu(in[0]); }, {gate_up}, swiglu_upstream),
      run_with_grad([](const auto& in) { return swiglu_composition(in[0]); }, {gate_up},
                    swiglu_upstream),
      kFp32Tolerance);

  Rotary rotary(8, 4, 10000.0);
  rotary->to(at::kCUDA);
  const at::Tensor cos = rotary->cos(1, 2);
  const at::Tensor sin = rotary->sin(1, 2);
  const at::Tensor x = at::randn({kPastTheLimit, 2, 3, 8}, cuda);
  const at::Tensor upstream = at::randn({kPastTheLimit, 2, 3, 8}, cuda);
  expect_close(
      run_with_grad([&](const auto& in) { return cuda_rotary(in[0], cos, sin, 2); }, {x}, upstream),
      run_with_grad([&](const auto& in) { return rotate_leading_heads(in[0], cos, sin, 2); }, {x},
                    upstream),
      kFp32Tolerance);

  const int64_t rows = kPastTheLimit * 64 + 17;
  const std::vector<at::Tensor> inputs = {at::randn({rows, 4}, cuda), at::randn({4}, cuda)};
  at::Tensor norm_upstream = at::randn({rows, 4}, cuda);
  norm_upstream.narrow(0, 65535 * 64, rows - 65535 * 64).mul_(1e4);
  expect_close(run_with_grad(cuda_norm, inputs, norm_upstream),
               run_with_grad(composed_norm, inputs, norm_upstream), kFp32Tolerance);
}

// No rows: empty outputs and gradients, and a zero weight gradient, with no launch (a grid of
// no blocks is a CUDA error).
TEST_F(CudaKernels, KernelsTakeNoRows) {
  const at::Tensor weight = at::randn({37}, cuda);
  const ForwardBackward norm =
      run_with_grad(cuda_norm, {at::randn({0, 37}, cuda), weight}, at::randn({0, 37}, cuda));
  EXPECT_EQ(norm.output.numel(), 0);
  EXPECT_EQ(norm.grads[0].sizes(), at::IntArrayRef({0, 37}));
  EXPECT_TRUE(at::equal(norm.grads[1], at::zeros({37}, cuda)));

  const auto add_norm = [](const std::vector<at::Tensor>& in) {
    const auto [sum, normed] = cuda_add_rms_norm(in[0], in[1], in[2], 1e-6);
    return testing::joined({sum, normed});
  };
  const ForwardBackward folded = run_with_grad(
      add_norm, {at::randn({0, 37}, cuda), at::randn({0, 37}, cuda), weight}, at::randn({0}, cuda));
  EXPECT_EQ(folded.grads[1].sizes(), at::IntArrayRef({0, 37}));
  EXPECT_TRUE(at::equal(folded.grads[2], at::zeros({37}, cuda)));

  const ForwardBackward swiglu = run_with_grad([](const auto& in) { return cuda_swiglu(in[0]); },
                                               {at::randn({0, 18}, cuda)}, at::randn({0, 9}, cuda));
  EXPECT_EQ(swiglu.output.sizes(), at::IntArrayRef({0, 9}));
  EXPECT_EQ(swiglu.grads[0].sizes(), at::IntArrayRef({0, 18}));

  Rotary rotary(8, 4, 10000.0);
  rotary->to(at::kCUDA);
  const ForwardBackward rotated = run_with_grad(
      [&](const auto& in) { return cuda_rotary(in[0], rotary->cos(0, 2), rotary->sin(0, 2), 1); },
      {at::randn({0, 2, 3, 8}, cuda)}, at::randn({0, 2, 3, 8}, cuda));
  EXPECT_EQ(rotated.grads[0].sizes(), at::IntArrayRef({0, 2, 3, 8}));
}

// ---- the projections ----

// With the CUDA kernels a projection adds its weight's gradient into .grad inside its GEMM: in
// fp32, and under bf16 autocast as a bf16 GEMM that writes fp32. A .grad that is a view into a
// bucket stays that view and receives the sum; the gradients are the plain projection's.
TEST_F(CudaKernels, ProjectionsAddTheirWeightGradientsIntoTheirBucketViews) {
  at::manual_seed(607);
  for (const bool bf16 : {false, true}) {
    const at::Tensor x = at::randn({3, 5, 64}, cuda);
    const at::Tensor upstream = at::randn({3, 5, 48}, cuda);
    const at::Tensor before = at::randn({48, 64}, cuda);
    const auto gradients = [&](bool fused) {
      const at::Tensor bucket = at::zeros({48 * 64 + 16}, cuda);
      at::manual_seed(608);
      const at::Tensor leaf = (at::randn({48, 64}, cuda) * 0.1).requires_grad_();
      leaf.mutable_grad() = bucket.narrow(0, 16, 48 * 64).view({48, 64});
      leaf.mutable_grad().copy_(before);
      const at::Tensor input = x.clone().requires_grad_();
      {
        const AutocastGuard autocast(at::Device(at::kCUDA), bf16);
        const at::Tensor out = project(input, leaf, fused ? Kernels::fused_cuda : Kernels::aten);
        out.backward(upstream.to(out.scalar_type()));
      }
      if (fused) {
        EXPECT_EQ(leaf.grad().data_ptr(), bucket.narrow(0, 16, 1).data_ptr())
            << "the gradient left its bucket view";
      }
      return std::make_pair(leaf.grad().clone(), input.grad().clone());
    };
    const auto [fused_weight, fused_input] = gradients(true);
    const auto [plain_weight, plain_input] = gradients(false);
    const double tolerance = bf16 ? kOneBf16Rounding : kFp32Tolerance;
    EXPECT_LE(relative_error(fused_weight - before, plain_weight - before), tolerance)
        << (bf16 ? "bf16" : "fp32");
    EXPECT_LE(relative_error(fused_input, plain_input), tolerance) << (bf16 ? "bf16" : "fp32");
  }
}

// ---- the model ----

// The tiny model built with the CUDA kernels against the same weights built with ATen's: the loss
// and every gradient, in fp32 and under bf16 autocast.
TEST_F(CudaKernels, TheModelWithThemMatchesTheModelWithout) {
  for (const bool bf16 : {false, true}) {
    at::manual_seed(606);
    Llama aten(testing::tiny_config(), Kernels::aten);
    Llama fused(testing::tiny_config(), Kernels::fused_cuda);
    aten->to(at::kCUDA);
    fused->to(at::kCUDA);
    {
      at::NoGradGuard no_grad;
      const auto from = aten->parameters();
      const auto to = fused->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    const at::Tensor window =
        at::randint(testing::tiny_config().vocab_size, {4, 33}, cuda.dtype(at::kLong));
    const at::Tensor aten_loss = window_loss(aten, window, window.device(), bf16);
    const at::Tensor fused_loss = window_loss(fused, window, window.device(), bf16);
    aten_loss.backward();
    fused_loss.backward();
    const double loss_tolerance = bf16 ? 1e-2 : 1e-5;
    EXPECT_NEAR(fused_loss.item<double>(), aten_loss.item<double>(),
                loss_tolerance * aten_loss.item<double>())
        << (bf16 ? "bf16" : "fp32");
    const auto from = aten->named_parameters();
    const auto to = fused->named_parameters();
    for (size_t i = 0; i < from.size(); ++i) {
      EXPECT_LE(relative_error(to[i].value().grad(), from[i].value().grad()), bf16 ? 3e-2 : 1e-5)
          << from[i].key() << (bf16 ? ", bf16" : ", fp32");
    }
  }
}

}  // namespace
}  // namespace mltrain
