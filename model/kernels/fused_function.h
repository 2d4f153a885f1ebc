#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/result_type.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

#include "model/kernels/autocast_region.h"

// What the fused kernels share on the CPU (cpu_kernels.cpp) and on CUDA (cuda_kernels.cpp): the
// checks of their arguments and their autograd functions, over a Device that runs the kernels on
// tensors (contiguous or not; its functions copy what they must) and gives
//   check_input(kernel, name, t): that the tensor named is one of its device and dtypes
//   rms_norm_forward(x, delta, weight, eps, out_dtype) -> NormForward: x normalised, or with delta
//     defined, the sum x + delta in x's dtype and that normalised
//   rms_norm_backward(grad, grad_residual, x, weight, rstd) -> (grad_x, grad_weight): grad_x with
//     grad_residual added where it is defined (the gradient of the sum's other use)
//   rotate(x, cos, sin, rotated_heads, inverse) -> rotated x (inverse: by the negative angle)
//   swiglu_forward(gate_up), swiglu_backward(grad, gate_up) -> output, grad_gate_up
// `kernel` names the caller in the messages of TORCH_CHECK.
namespace mltrain::fused_function {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether autograd records the call: otherwise the kernels run without a node and keep nothing.
inline bool records_graph(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const at::Tensor& t) { return t.requires_grad(); });
}

// The backward passes are written as kernels, not as differentiable ATen ops: a backward with
// create_graph would build no graph of them, and its second derivatives would be silently wrong.
inline void check_once_differentiable() {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "mltrain's fused kernels are differentiable once: backward with create_graph is not "
              "supported (train.kernels: aten is)");
}

// The rows of t as [rows, last dimension].
inline int64_t rows_of(const at::Tensor& t) { return t.numel() == 0 ? 0 : t.numel() / t.size(-1); }

// The dtype a fused RMSNorm gives on `device`: under bf16 autocast, bf16, which is exactly what the
// projection that takes it would cast the composition's fp32 output to, without the fp32 tensor;
// otherwise fp32, the composition's (x's dtype promoted with the fp32 weight).
inline at::ScalarType rms_norm_output_dtype(c10::DeviceType device) {
  const AutocastSettings autocast = AutocastSettings::now(device);
  return autocast.enabled && autocast.dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

// What a device's rms_norm_forward gives: with a residual add, its sum (undefined without), the
// normalised output, and each row's 1 / rms for backward.
struct NormForward {
  at::Tensor sum;
  at::Tensor output;
  at::Tensor rstd;

  // Uninitialised, for the kernels to fill: a sum where there is a delta, the output in out_dtype.
  static NormForward empty_for(const at::Tensor& x, const at::Tensor& delta,
                               at::ScalarType out_dtype) {
    return {.sum = delta.defined() ? at::empty(x.sizes(), x.options()) : at::Tensor(),
            .output = at::empty(x.sizes(), x.options().dtype(out_dtype)),
            .rstd = at::empty({rows_of(x)}, x.options().dtype(at::kFloat))};
  }
};

// An optional tensor (delta, the residual's gradient) as a kernel reads it: contiguous, in dtype
// where one is given; undefined where it is.
inline at::Tensor contiguous_if_defined(const at::Tensor& t,
                                        std::optional<at::ScalarType> dtype = std::nullopt) {
  return t.defined() ? t.to(dtype.value_or(t.scalar_type())).contiguous() : t;
}

template <typename Device>
class RMSNormFunction : public torch::autograd::Function<RMSNormFunction<Device>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, at::ScalarType out_dtype) {
    NormForward result = Device::rms_norm_forward(x, at::Tensor(), weight, eps, out_dtype);
    ctx->save_for_backward({x, weight, result.rstd});
    return result.output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const variable_list saved = ctx->get_saved_variables();
    auto [grad_x, grad_weight] =
        Device::rms_norm_backward(grads[0], at::Tensor(), saved[0], saved[1], saved[2]);
    return {grad_x, grad_weight, at::Tensor(), at::Tensor()};
  }
};

// (x + delta, rms_norm(x + delta)): backward takes the sum's gradient from its other use (the
// residual stream) and adds it to the one through the norm in the same pass, and gives the total to
// both x and delta, in their dtypes.
template <typename Device>
class AddRMSNormFunction : public torch::autograd::Function<AddRMSNormFunction<Device>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, at::ScalarType out_dtype) {
    NormForward result = Device::rms_norm_forward(x, delta, weight, eps, out_dtype);
    ctx->save_for_backward({result.sum, weight, result.rstd});
    ctx->saved_data["delta_dtype"] = static_cast<int64_t>(delta.scalar_type());
    return {result.sum, result.output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const variable_list saved = ctx->get_saved_variables();
    auto [grad_sum, grad_weight] =
        Device::rms_norm_backward(grads[1], grads[0], saved[0], saved[1], saved[2]);
    const auto delta_dtype = static_cast<at::ScalarType>(ctx->saved_data["delta_dtype"].toInt());
    return {grad_sum, grad_sum.to(delta_dtype), grad_weight, at::Tensor(), at::Tensor()};
  }
};

template <typename Device>
class RotaryFunction : public torch::autograd::Function<RotaryFunction<Device>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t rotated_heads) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["rotated_heads"] = rotated_heads;
    return Device::rotate(x, cos, sin, rotated_heads, /*inverse=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const variable_list tables = ctx->get_saved_variables();
    const int64_t rotated_heads = ctx->saved_data["rotated_heads"].toInt();
    return {Device::rotate(grads[0], tables[0], tables[1], rotated_heads, /*inverse=*/true),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <typename Device>
class SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction<Device>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    return Device::swiglu_forward(gate_up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    return {Device::swiglu_backward(grads[0], ctx->get_saved_variables()[0])};
  }
};

// The layers' entry points, as fused_rms_norm, fused_rotary and fused_swiglu (cpu_kernels.h) and
// their CUDA namesakes (cuda_kernels.h) describe them: the arguments checked, then the autograd
// function where autograd records, or the kernels alone.
template <typename Device>
void check_rms_norm_inputs(const char* kernel, const at::Tensor& x, const at::Tensor& weight) {
  Device::check_input(kernel, "x", x);
  Device::check_input(kernel, "weight", weight);
  TORCH_CHECK(weight.scalar_type() == at::kFloat, kernel, ": weight is ", weight.scalar_type(),
              ", it must be Float");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
                  weight.device() == x.device(),
              kernel, ": weight ", weight.sizes(), " on ", weight.device(), " does not match x ",
              x.sizes(), " on ", x.device());
}

template <typename Device>
at::Tensor rms_norm(const char* kernel, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rms_norm_inputs<Device>(kernel, x, weight);
  const at::ScalarType out_dtype = rms_norm_output_dtype(x.device().type());
  if (records_graph({x, weight})) return RMSNormFunction<Device>::apply(x, weight, eps, out_dtype);
  return Device::rms_norm_forward(x, at::Tensor(), weight, eps, out_dtype).output;
}

// Whether add_rms_norm takes this pair: the sum keeps x's dtype (fp32 + fp32 or bf16, bf16 + bf16),
// as the composition's x + delta does, and delta is x's shape, with no broadcast.
inline bool add_keeps_dtype_and_shape(const at::Tensor& x, const at::Tensor& delta) {
  return at::result_type(x, delta) == x.scalar_type() && delta.sizes() == x.sizes();
}

template <typename Device>
std::pair<at::Tensor, at::Tensor> add_rms_norm(const char* kernel, const at::Tensor& x,
                                               const at::Tensor& delta, const at::Tensor& weight,
                                               double eps) {
  check_rms_norm_inputs<Device>(kernel, x, weight);
  Device::check_input(kernel, "delta", delta);
  TORCH_CHECK(add_keeps_dtype_and_shape(x, delta) && delta.device() == x.device(), kernel,
              ": delta ", delta.sizes(), " (", delta.scalar_type(), ") on ", delta.device(),
              " must be x's shape on x's device, and x + delta of x's dtype: x is ", x.sizes(),
              " (", x.scalar_type(), ") on ", x.device());
  const at::ScalarType out_dtype = rms_norm_output_dtype(x.device().type());
  if (records_graph({x, delta, weight})) {
    variable_list outputs = AddRMSNormFunction<Device>::apply(x, delta, weight, eps, out_dtype);
    return {outputs[0], outputs[1]};
  }
  NormForward result = Device::rms_norm_forward(x, delta, weight, eps, out_dtype);
  return {result.sum, result.output};
}

template <typename Device>
at::Tensor rotary(const char* kernel, const at::Tensor& x, const at::Tensor& cos,
                  const at::Tensor& sin, int64_t rotated_heads) {
  Device::check_input(kernel, "x", x);
  Device::check_input(kernel, "cos", cos);
  Device::check_input(kernel, "sin", sin);
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.device() == x.device() && sin.device() == x.device(),
              kernel, ": the tables must be Float, on x's device ", x.device());
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, kernel, ": x is ", x.sizes(),
              ", it must be [B, T, H, D] with D even");
  TORCH_CHECK(rotated_heads >= 0 && rotated_heads <= x.size(2), kernel, ": ", rotated_heads,
              " heads to rotate of x ", x.sizes());
  const bool shared_tables = cos.dim() == 2 && cos.size(0) == x.size(1);
  const bool tables_per_row =
      cos.dim() == 3 && cos.size(0) == x.size(0) && cos.size(1) == x.size(1);
  TORCH_CHECK(
      (shared_tables || tables_per_row) && cos.size(-1) == x.size(3) && sin.sizes() == cos.sizes(),
      kernel, ": tables cos ", cos.sizes(), " and sin ", sin.sizes(),
      " must both be [T, D] or [B, T, D] of x ", x.sizes());
  TORCH_CHECK(!(at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())), kernel,
              ": the tables take no gradient");
  if (records_graph({x})) return RotaryFunction<Device>::apply(x, cos, sin, rotated_heads);
  return Device::rotate(x, cos, sin, rotated_heads, /*inverse=*/false);
}

template <typename Device>
at::Tensor swiglu(const char* kernel, const at::Tensor& gate_up) {
  Device::check_input(kernel, "gate_up", gate_up);
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, kernel, ": gate_up is ",
              gate_up.sizes(), ", its last dimension must hold gate and up, of one width");
  if (records_graph({gate_up})) return SwiGLUFunction<Device>::apply(gate_up);
  return Device::swiglu_forward(gate_up);
}

}  // namespace mltrain::fused_function
