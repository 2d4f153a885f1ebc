#include "model/layers/linear.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <string>
#include <utility>

#include "model/kernels/autocast_region.h"
#include "model/kernels/kernels.h"

namespace mltrain {
namespace {

// Counts its calls and keeps the gradient each call saw.
class RecordingHook : public torch::autograd::PostAccumulateGradHook {
 public:
  RecordingHook(int* calls, at::Tensor* seen) : calls_(calls), seen_(seen) {}
  void operator()(const torch::autograd::Variable& weight) override {
    ++*calls_;
    *seen_ = weight.grad().defined() ? weight.grad().clone() : at::Tensor();
  }

 private:
  int* calls_;
  at::Tensor* seen_;
};

bool runs_projection(const at::Tensor& out) {
  return out.grad_fn()->name().find("ProjectionFunction") != std::string::npos;
}

struct Case {
  at::Tensor x;       // [2, 5, 8]
  at::Tensor weight;  // [6, 8]
  at::Tensor upstream;
};

Case make_case() {
  at::manual_seed(11);
  return {at::randn({2, 5, 8}).requires_grad_(true), at::randn({6, 8}).requires_grad_(true),
          at::randn({2, 5, 6})};
}

// The gradients at::linear gives: the independent reference.
std::pair<at::Tensor, at::Tensor> reference_grads(const Case& c) {
  const at::Tensor x = c.x.detach().clone().requires_grad_(true);
  const at::Tensor weight = c.weight.detach().clone().requires_grad_(true);
  at::linear(x, weight).backward(c.upstream);
  return {x.grad(), weight.grad()};
}

// The gradient reducer launches a bucket from the post-accumulate hook: it must run once per
// backward, with the gradient already in .grad.
TEST(Projection, GradientsEqualLinearsAndTheHookRunsOnceAfterThem) {
  const Case c = make_case();
  int hook_calls = 0;
  at::Tensor seen_by_hook;
  torch::autograd::impl::set_post_acc_grad_hooks(
      c.weight, std::make_unique<RecordingHook>(&hook_calls, &seen_by_hook));
  const at::Tensor out = project(c.x, c.weight, Kernels::fused_cpu);
  EXPECT_TRUE(runs_projection(out));
  EXPECT_TRUE(at::equal(out, at::linear(c.x, c.weight)));
  out.backward(c.upstream);
  const auto [grad_x, grad_weight] = reference_grads(c);
  EXPECT_TRUE(at::allclose(c.x.grad(), grad_x, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(c.weight.grad(), grad_weight, 1e-6, 1e-6));
  EXPECT_EQ(hook_calls, 1);
  ASSERT_TRUE(seen_by_hook.defined()) << "the hook ran before the gradient was in";
  EXPECT_TRUE(at::equal(seen_by_hook, c.weight.grad()));
}

// A gradient bucket's view receives the gradient in place: the same memory, added to.
TEST(Projection, AddsTheWeightGradientIntoAnExistingGradInPlace) {
  const Case c = make_case();
  const at::Tensor bucket = at::full({100}, 0.5f);
  const at::Tensor view = bucket.narrow(0, 4, 48).view({6, 8});
  c.weight.mutable_grad() = view;
  const at::Tensor out = project(c.x, c.weight, Kernels::fused_cpu);
  ASSERT_TRUE(runs_projection(out)) << "AccumulateGrad would add in place too";
  out.backward(c.upstream);
  const auto [grad_x, grad_weight] = reference_grads(c);
  EXPECT_EQ(c.weight.grad().data_ptr(), view.data_ptr()) << "the .grad was replaced";
  EXPECT_TRUE(at::allclose(view, grad_weight + 0.5f, 1e-6, 1e-6));
  EXPECT_EQ(bucket[3].item<float>(), 0.5f) << "written outside the view";
  EXPECT_EQ(bucket[52].item<float>(), 0.5f) << "written outside the view";
}

// Elsewhere (the aten kernels, autocast) the projection is at::linear with its usual backward.
TEST(Projection, IsPlainLinearUnderAtenOrAutocast) {
  const Case c = make_case();
  const auto [grad_x, grad_weight] = reference_grads(c);
  for (const bool autocast : {false, true}) {
    const Kernels kernels = autocast ? Kernels::fused_cpu : Kernels::aten;
    c.weight.mutable_grad() = at::Tensor();
    at::Tensor out;
    {
      const AutocastGuard scope(c10::Device(c10::kCPU), autocast);
      out = project(c.x, c.weight, kernels);
    }
    EXPECT_EQ(out.scalar_type(), autocast ? at::kBFloat16 : at::kFloat);
    EXPECT_FALSE(runs_projection(out)) << out.grad_fn()->name();
    out.to(at::kFloat).backward(c.upstream);
    const double tolerance = autocast ? 3e-2 : 1e-6;
    EXPECT_TRUE(at::allclose(c.weight.grad(), grad_weight, tolerance, tolerance));
  }
}

TEST(Projection, RefusesASecondDerivative) {
  const Case c = make_case();
  const at::Tensor out = project(c.x, c.weight, Kernels::fused_cpu);
  EXPECT_THROW(out.backward(c.upstream, /*retain_graph=*/true, /*create_graph=*/true), c10::Error);
}

}  // namespace
}  // namespace mltrain
