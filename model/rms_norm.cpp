#include "model/rms_norm.h"

#include <ATen/ATen.h>

#include "model/cpu_kernels.h"
#include "model/cuda_kernels.h"

namespace mltrain {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, Kernels kernels)
    : weight(register_parameter("weight", at::ones({dim}))), eps_(eps), kernels_(kernels) {}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  if (weight.scalar_type() == at::kFloat) {
    if (runs_fused_cpu(kernels_, x)) return fused_rms_norm(x, weight, eps_);
    if (runs_fused_cuda(kernels_, x)) return cuda_rms_norm(x, weight, eps_);
  }
  return rms_norm_composition(x, weight, eps_);
}

at::Tensor rms_norm_composition(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

}  // namespace mltrain
