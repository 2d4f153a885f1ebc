#include "model/layers/rms_norm.h"

#include <ATen/ATen.h>

#include <utility>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/cuda_kernels.h"
#include "model/kernels/fused_function.h"

namespace mltrain {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, Kernels kernels, const WeightOptions& options)
    : weight(register_parameter(
          "weight", options.bytes ? at::ones({dim}, options.tensor) : options.make({dim}))),
      eps_(eps),
      kernels_(kernels) {}

namespace {

// The weight in fp32 where x is: one vector's cast of a weight gathered in bf16 (ZeRO-3 under
// autocast, dist/unit_shards.h), so that the fused kernels take it as they take a kept one.
at::Tensor weight_for(const at::Tensor& weight, const at::Tensor& x) {
  const bool gathered_bf16 = weight.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kFloat;
  return gathered_bf16 ? weight.to(at::kFloat) : weight;
}

}  // namespace

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor w = weight_for(weight, x);
  if (w.scalar_type() == at::kFloat) {
    if (runs_fused_cpu(kernels_, x)) return fused_rms_norm(x, w, eps_);
    if (runs_fused_cuda(kernels_, x)) return cuda_rms_norm(x, w, eps_);
  }
  return rms_norm_composition(x, w, eps_);
}

std::pair<at::Tensor, at::Tensor> RMSNormImpl::add_then_forward(const at::Tensor& residual,
                                                                const at::Tensor& delta) {
  const at::Tensor w = weight_for(weight, residual);
  if (w.scalar_type() == at::kFloat && fused_function::add_keeps_dtype_and_shape(residual, delta)) {
    if (runs_fused_cpu(kernels_, residual) && runs_fused_cpu(kernels_, delta)) {
      return fused_add_rms_norm(residual, delta, w, eps_);
    }
    if (runs_fused_cuda(kernels_, residual) && runs_fused_cuda(kernels_, delta)) {
      return cuda_add_rms_norm(residual, delta, w, eps_);
    }
  }
  at::Tensor sum = residual + delta;
  at::Tensor normed = forward(sum);
  return {std::move(sum), std::move(normed)};
}

at::Tensor rms_norm_composition(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

}  // namespace mltrain
