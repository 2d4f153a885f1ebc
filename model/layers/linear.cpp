#include "model/layers/linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <utility>

namespace mltrain {

at::Tensor WeightOptions::make(at::IntArrayRef sizes) const {
  if (bytes) return at::empty(sizes, tensor);
  at::Tensor sized = at::empty({0}, tensor);
  sized.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return sized;
}

MatrixImpl::MatrixImpl(int64_t rows, int64_t columns, const WeightOptions& options) {
  at::Tensor matrix = options.make({rows, columns});
  if (options.bytes && options.drawn) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(columns));
    matrix.uniform_(-bound, bound);
  }
  weight = register_parameter("weight", std::move(matrix));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor as_rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// .grad += a @ b: in place, inside the GEMM, when .grad exists (a bucket view stays one). a and b
// are the weight's dtype, or bf16 for an fp32 weight on CUDA, where the GEMM computes in bf16 and
// writes fp32 (addmm's out_dtype, which only CUDA has).
void accumulate_weight_grad(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor& grad = weight.mutable_grad();
  if (a.scalar_type() == weight.scalar_type()) {
    if (grad.defined()) {
      grad.addmm_(a, b);
    } else {
      grad = at::mm(a, b);
    }
  } else if (grad.defined()) {
    at::addmm_out(grad, grad, a, b, weight.scalar_type());
  } else {
    grad = at::mm(a, b, weight.scalar_type());
  }
}

void check_once_differentiable() {
  // The weight's gradient is added in place, outside any graph: nothing to differentiate again.
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "mltrain's projection is differentiable once: backward with create_graph is not "
              "supported (train.kernels: aten is)");
}

// x @ weight^T computed in `dtype`: the fp32 weight's own, or under bf16 autocast on CUDA bf16,
// the product of autocast's bf16 casts of x and the weight (the weight's from autocast's cache,
// which WeightCastCache keeps across micro-steps), which backward keeps, as autocast's at::linear
// would. Backward adds the weight's gradient into .grad inside its GEMM (in bf16, a GEMM that
// writes fp32), with no gradient tensor of its own and no separate add.
//
// A saved leaf unpacks as the parameter itself, whose .grad backward updates. The weight's
// gradient output stays undefined, so its AccumulateGrad adds nothing; in torch 2.11 it still runs
// the weight's post-accumulate-grad hook (the gradient reducer's signal that the gradient is in),
// after this node, once per backward: linear_test.cpp holds the version to that.
class ProjectionFunction : public torch::autograd::Function<ProjectionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            at::ScalarType dtype) {
    at::Tensor x_cast = x;
    at::Tensor weight_cast = weight;
    if (dtype == at::kBFloat16) {
      x_cast = at::autocast::cached_cast(at::kBFloat16, x, c10::DeviceType::CUDA);
      // The cast autocast caches is one any later user of the cache may take, so it is made as
      // autocast makes it, with its gradient's path to the weight (forward runs without grad).
      const at::AutoGradMode recorded(true);
      weight_cast = at::autocast::cached_cast(at::kBFloat16, weight, c10::DeviceType::CUDA);
    }
    // The weight itself too, whose .grad backward adds into (in fp32 the same tensor twice).
    ctx->save_for_backward({x_cast, weight_cast, weight});
    return at::linear(x_cast, weight_cast);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x_cast = saved[0];
    const at::Tensor& weight_cast = saved[1];
    const at::Tensor grad_rows = as_rows(grads[0]).to(x_cast.scalar_type());
    // In the product's dtype; autograd casts it to x's, as autocast's cast would in backward.
    at::Tensor grad_x;
    if (ctx->needs_input_grad(0)) grad_x = grad_rows.mm(weight_cast).view(x_cast.sizes());
    if (ctx->needs_input_grad(1)) accumulate_weight_grad(saved[2], grad_rows.t(), as_rows(x_cast));
    return {grad_x, at::Tensor(), at::Tensor()};
  }
};

// A weight whose gradient is added into .grad in place: a leaf that wants one, while autograd
// records.
bool takes_gradient_in_place(const at::Tensor& weight) {
  return at::GradMode::is_enabled() && weight.requires_grad() && weight.is_leaf() &&
         weight.scalar_type() == at::kFloat;
}

bool bf16_autocast(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(device) &&
         at::autocast::get_autocast_dtype(device) == at::kBFloat16;
}

}  // namespace

at::Tensor project(const at::Tensor& x, const at::Tensor& weight, Kernels kernels) {
  const bool ours = (kernels == Kernels::fused_cpu && x.device().is_cpu()) ||
                    (kernels == Kernels::fused_cuda && x.is_cuda());
  if (ours && takes_gradient_in_place(weight)) {
    const c10::DeviceType device = x.device().type();
    if (!at::autocast::is_autocast_enabled(device) && x.scalar_type() == at::kFloat) {
      return ProjectionFunction::apply(x, weight, at::kFloat);
    }
    if (x.is_cuda() && bf16_autocast(device)) {
      return ProjectionFunction::apply(x, weight, at::kBFloat16);
    }
  }
  return at::linear(x, weight);
}

}  // namespace mltrain
