#include "model/linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace mltrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor as_rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// .grad += a @ b: in place, inside the GEMM, when .grad exists (a bucket view stays one).
void accumulate_weight_grad(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor& grad = weight.mutable_grad();
  if (grad.defined()) {
    grad.addmm_(a, b);
  } else {
    grad = at::mm(a, b);
  }
}

// A saved leaf unpacks as the parameter itself, whose .grad backward updates. The weight's
// gradient output stays undefined, so its AccumulateGrad adds nothing; in torch 2.11 it still runs
// the weight's post-accumulate-grad hook (the gradient reducer's signal that the gradient is in),
// after this node, once per backward: linear_test.cpp holds the version to that.
class ProjectionFunction : public torch::autograd::Function<ProjectionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The weight's gradient is added in place, outside any graph: nothing to differentiate again.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "mltrain's projection is differentiable once: backward with create_graph is not "
                "supported (train.kernels: aten is)");
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor grad_rows = as_rows(grads[0]);
    at::Tensor grad_x;
    if (ctx->needs_input_grad(0)) grad_x = grad_rows.mm(weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) accumulate_weight_grad(weight, grad_rows.t(), as_rows(x));
    return {grad_x, at::Tensor()};
  }
};

bool accumulates_in_gemm(const at::Tensor& x, const at::Tensor& weight, Kernels kernels) {
  return kernels == Kernels::fused_cpu && x.device().is_cpu() && at::GradMode::is_enabled() &&
         weight.requires_grad() && weight.is_leaf() && x.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat && !at::autocast::is_autocast_enabled(c10::kCPU);
}

}  // namespace

at::Tensor project(const at::Tensor& x, const at::Tensor& weight, Kernels kernels) {
  if (accumulates_in_gemm(x, weight, kernels)) return ProjectionFunction::apply(x, weight);
  return at::linear(x, weight);
}

}  // namespace mltrain
