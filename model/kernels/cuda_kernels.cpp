#include "model/kernels/cuda_kernels.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

#include "model/kernels/cuda_launch.h"
#include "model/kernels/fused_function.h"

namespace mltrain {
namespace {

using fused_function::check_once_differentiable;
using fused_function::records_graph;
using fused_function::rows_of;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The kernels on tensors, for fused_function's entry points and autograd functions.
struct CudaDevice {
  static void check_input(const char* kernel, const char* name, const at::Tensor& t) {
    TORCH_CHECK(cuda_kernels_built(), kernel,
                ": this mltrain was built against a LibTorch without CUDA, so without its CUDA "
                "kernels");
    TORCH_CHECK(t.defined() && t.is_cuda(), kernel, ": ", name,
                " must be a CUDA tensor; other devices have kernels of their own or the ATen "
                "composition");
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, kernel, ": ",
                name, " is ", t.scalar_type(), ": the CUDA kernels take Float and BFloat16");
  }

  static fused_function::NormForward rms_norm_forward(const at::Tensor& x, const at::Tensor& delta,
                                                      const at::Tensor& weight, double eps,
                                                      at::ScalarType out_dtype) {
    fused_function::NormForward result =
        fused_function::NormForward::empty_for(x, delta, out_dtype);
    cuda_launch::rms_norm_forward(x.contiguous(), fused_function::contiguous_if_defined(delta),
                                  weight.contiguous(), eps, result.sum, result.output, result.rstd);
    return result;
  }

  static std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad,
                                                             const at::Tensor& grad_residual,
                                                             const at::Tensor& x_in,
                                                             const at::Tensor& weight,
                                                             const at::Tensor& rstd) {
    const at::Tensor x = x_in.contiguous();
    at::Tensor grad_x = at::empty_like(x);
    at::Tensor grad_weight = at::empty_like(weight);
    cuda_launch::rms_norm_backward(
        grad.contiguous(), fused_function::contiguous_if_defined(grad_residual, x.scalar_type()), x,
        weight.contiguous(), rstd, grad_x, grad_weight);
    return {grad_x, grad_weight};
  }

  static at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t rotated_heads, bool inverse) {
    at::Tensor out = at::empty(x.sizes(), x.options());
    cuda_launch::rotary(x.contiguous(), cos.contiguous(), sin.contiguous(), rotated_heads, inverse,
                        out);
    return out;
  }

  static at::Tensor swiglu_forward(const at::Tensor& gate_up) {
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() /= 2;
    at::Tensor out = at::empty(sizes, gate_up.options());
    cuda_launch::swiglu_forward(gate_up.contiguous(), out);
    return out;
  }

  static at::Tensor swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_up_in) {
    const at::Tensor gate_up = gate_up_in.contiguous();
    at::Tensor grad_gate_up = at::empty_like(gate_up);
    // The output's gradient comes in the output's dtype, gate_up's.
    cuda_launch::swiglu_backward(grad.to(gate_up.scalar_type()).contiguous(), gate_up,
                                 grad_gate_up);
    return grad_gate_up;
  }
};

// ---- Cross-entropy ----

// The mean loss, and what backward needs: the logits and targets as the kernels took them, and
// each row's max and log(sum(exp(logit - max))).
struct CrossEntropyForward {
  at::Tensor loss;
  at::Tensor logits;
  at::Tensor targets;
  at::Tensor row_max;
  at::Tensor row_log_sum;
};

CrossEntropyForward cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets) {
  const auto fp32 = logits.options().dtype(at::kFloat);
  CrossEntropyForward result{.loss = at::Tensor(),
                             .logits = logits.contiguous(),
                             .targets = targets.contiguous(),
                             .row_max = at::empty({logits.size(0)}, fp32),
                             .row_log_sum = at::empty({logits.size(0)}, fp32)};
  const at::Tensor losses = at::empty({logits.size(0)}, fp32);
  cuda_launch::cross_entropy_forward(result.logits, result.targets, losses, result.row_max,
                                     result.row_log_sum);
  result.loss = losses.mean();
  return result;
}

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, bool gradient_overwrites_logits) {
    const CrossEntropyForward result = cross_entropy_forward(logits, targets);
    ctx->save_for_backward({result.logits, result.targets, result.row_max, result.row_log_sum});
    ctx->saved_data["gradient_overwrites_logits"] = gradient_overwrites_logits;
    return result.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const variable_list saved = ctx->get_saved_variables();
    // Overwritten, each thread reads its logit before it writes its gradient there. Detached, the
    // gradient is not the graph's node; it shares the logits' version counter, which is bumped.
    at::Tensor grad_logits = saved[0].detach();
    if (ctx->saved_data["gradient_overwrites_logits"].toBool()) {
      grad_logits.unsafeGetTensorImpl()->bump_version();
    } else {
      grad_logits = at::empty_like(saved[0]);
    }
    cuda_launch::cross_entropy_backward(grads[0].to(at::kFloat).contiguous(), saved[0], saved[1],
                                        saved[2], saved[3], grad_logits);
    return {grad_logits, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool cuda_kernels_built() { return cuda_launch::built(); }

at::Tensor cuda_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return fused_function::rms_norm<CudaDevice>("cuda_rms_norm", x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> cuda_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                    const at::Tensor& weight, double eps) {
  return fused_function::add_rms_norm<CudaDevice>("cuda_add_rms_norm", x, delta, weight, eps);
}

at::Tensor cuda_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t rotated_heads) {
  return fused_function::rotary<CudaDevice>("cuda_rotary", x, cos, sin, rotated_heads);
}

at::Tensor cuda_swiglu(const at::Tensor& gate_up) {
  return fused_function::swiglu<CudaDevice>("cuda_swiglu", gate_up);
}

at::Tensor cuda_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                              bool gradient_overwrites_logits) {
  CudaDevice::check_input("cuda_cross_entropy", "logits", logits);
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && targets.dim() == 1 &&
                  targets.size(0) == logits.size(0) && targets.scalar_type() == at::kLong &&
                  targets.device() == logits.device(),
              "cuda_cross_entropy: logits ", logits.sizes(), " and targets ", targets.sizes(), " (",
              targets.scalar_type(), ") must be [N, V > 0] and [N] int64 on one device");
  // A view shares its base's memory: a view of a leaf is the leaf's memory too.
  const bool a_leafs_memory = logits.is_leaf() || (logits.is_view() && logits._base().is_leaf());
  TORCH_CHECK(!(gradient_overwrites_logits && logits.requires_grad() && a_leafs_memory),
              "cuda_cross_entropy: the gradient may only overwrite logits computed for the loss, "
              "not a leaf its caller holds or a view of one");
  if (records_graph({logits})) {
    return CrossEntropyFunction::apply(logits, targets, gradient_overwrites_logits);
  }
  return cross_entropy_forward(logits, targets).loss;
}

}  // namespace mltrain
