#include "model/rms_norm.h"

#include <ATen/ATen.h>

namespace mltrain {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps)
    : weight(register_parameter("weight", at::ones({dim}))), eps_(eps) {}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return normed.to(x.scalar_type()) * weight;
}

}  // namespace mltrain
