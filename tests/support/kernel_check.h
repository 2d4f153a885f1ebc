#pragma once

// Holding a fused kernel to the ATen composition it replaces: both run forward and backward on the
// same inputs, and the outputs and every input's gradient are compared. Shared by the CPU kernels'
// tests, the shared arithmetic's and the CUDA kernels'.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/layers/rms_norm.h"
#include "tests/support/test_support.h"

namespace mltrain::testing {

// fp32: a fused kernel does the composition's arithmetic in another order, with FMA, and with
// another exp (ATen's CPU exp_u20, CUDA's expf) where the composition takes SLEEF's; measured,
// they agree to a few 1e-8 at the model's shapes, so 1e-6 leaves room and still catches any real
// mistake.
constexpr double kFp32Tolerance = 1e-6;
// bf16 keeps 8 significant bits: one rounding is an rms relative error of about 1.7e-3 over many
// values, and the bf16 composition, which rounds after each of its operators, is 2.3e-3 to 2.6e-3
// from exact; the two differ by about 3e-3.
constexpr double kBf16Tolerance = 5e-3;
// The fused kernels compute in fp32 and round once: against the fp32 composition of the same
// bf16 values they are one rounding away, which the bf16 composition is not.
constexpr double kOneBf16Rounding = 2e-3;

struct ForwardBackward {
  at::Tensor output;
  std::vector<at::Tensor> grads;  // one per input
};

// f on fresh leaves equal to the inputs, then backward from the upstream gradient.
template <typename F>
ForwardBackward run_with_grad(const F& f, const std::vector<at::Tensor>& inputs,
                              const at::Tensor& upstream) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& input : inputs) leaves.push_back(input.detach().clone().requires_grad_());
  const at::Tensor output = f(leaves);
  output.backward(upstream.to(output.scalar_type()));
  ForwardBackward run{output.detach(), {}};
  for (const at::Tensor& leaf : leaves) run.grads.push_back(leaf.grad());
  return run;
}

inline void expect_close(const ForwardBackward& fused, const ForwardBackward& reference,
                         double tolerance) {
  EXPECT_EQ(fused.output.scalar_type(), reference.output.scalar_type());
  EXPECT_EQ(fused.output.sizes(), reference.output.sizes());
  EXPECT_LE(relative_error(fused.output, reference.output), tolerance) << "output";
  ASSERT_EQ(fused.grads.size(), reference.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    ASSERT_TRUE(fused.grads[i].defined()) << "input " << i;
    EXPECT_EQ(fused.grads[i].scalar_type(), reference.grads[i].scalar_type()) << "input " << i;
    EXPECT_LE(relative_error(fused.grads[i], reference.grads[i]), tolerance) << "input " << i;
  }
}

// The outputs of a kernel that gives several as one tensor for run_with_grad, each flattened to
// fp32 and joined, so that one upstream gradient reaches every output.
inline at::Tensor joined(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : outputs) flat.push_back(t.to(at::kFloat).flatten());
  return at::cat(flat);
}

// x + delta and its RMSNorm as the ATen layers compute them, both outputs joined, of inputs
// {x, delta, weight}: what a fused add-and-norm is held to. eps 1e-6.
inline at::Tensor composed_add_norm(const std::vector<at::Tensor>& in) {
  const at::Tensor sum = in[0] + in[1];
  return joined({sum, rms_norm_composition(sum, in[2], 1e-6)});
}

// Holds a fused add-and-norm's run (inputs {x, delta, weight}, outputs joined as composed_add_norm
// joins them) to the composition's: the sums bit for bit, and the norms and the gradients of x and
// the weight within tolerance, each on its own so that the larger sums do not hide the norms.
// delta's gradient is x's in delta's dtype: in bf16 beside an fp32 x, a rounding of the fp32
// gradient, which may fall the other way from the composition's.
inline void expect_add_norm_close(const ForwardBackward& fused, const ForwardBackward& composed,
                                  double tolerance) {
  const int64_t n = fused.output.numel() / 2;
  EXPECT_TRUE(at::equal(fused.output.narrow(0, 0, n), composed.output.narrow(0, 0, n))) << "sum";
  EXPECT_LE(relative_error(fused.output.narrow(0, n, n), composed.output.narrow(0, n, n)),
            tolerance)
      << "norm";
  ASSERT_EQ(fused.grads.size(), 3u);
  ASSERT_EQ(composed.grads.size(), 3u);
  for (const size_t input : {size_t{0}, size_t{2}}) {
    EXPECT_EQ(fused.grads[input].scalar_type(), composed.grads[input].scalar_type());
    EXPECT_LE(relative_error(fused.grads[input], composed.grads[input]), tolerance)
        << "input " << input;
  }
  const at::ScalarType delta_dtype = composed.grads[1].scalar_type();
  EXPECT_EQ(fused.grads[1].scalar_type(), delta_dtype);
  EXPECT_TRUE(at::equal(fused.grads[1], fused.grads[0].to(delta_dtype))) << "delta";
}

// The dtypes of (residual, delta) the fused add-and-norm takes: fp32 throughout, the bf16 delta a
// projection gives under autocast, and bf16 throughout.
inline const std::vector<std::pair<at::ScalarType, at::ScalarType>> kResidualAddDtypes = {
    {at::kFloat, at::kFloat}, {at::kFloat, at::kBFloat16}, {at::kBFloat16, at::kBFloat16}};

inline std::vector<at::Tensor> to_float(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.to(at::kFloat));
  return out;
}

}  // namespace mltrain::testing
