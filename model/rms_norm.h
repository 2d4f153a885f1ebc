#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace mltrain {

// x / sqrt(mean(x^2) + eps) * weight. The statistic is computed in fp32 whatever the input dtype
// (bf16 squares underflow) and the normalised value is cast back before the learnable scale.
// Runs fused_rms_norm (model/cpu_kernels.h) where kernel_choice() and the dtypes allow it, the
// composition otherwise.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// The layer as plain ATen operators: the reference the fused kernel is held to.
at::Tensor rms_norm_composition(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace mltrain
