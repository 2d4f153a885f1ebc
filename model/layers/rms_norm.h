#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <utility>

#include "model/kernels/kernels.h"
#include "model/layers/linear.h"

namespace mltrain {

// x / sqrt(mean(x^2) + eps) * weight. The statistic is computed in fp32 whatever the input dtype
// (bf16 squares underflow) and the normalised value is cast back before the learnable scale.
// With Kernels::fused_cpu it runs fused_rms_norm (model/kernels/cpu_kernels.h), with
// Kernels::fused_cuda cuda_rms_norm (model/kernels/cuda_kernels.h), where the device and the dtypes
// allow it, and the composition otherwise. The fused kernels give bf16 under bf16 autocast, what
// the projection that takes the result would cast it to; the composition gives fp32.
class RMSNormImpl : public torch::nn::Module {
 public:
  // The weight made as `options` say: ones where it has bytes.
  RMSNormImpl(int64_t dim, double eps, Kernels kernels, const WeightOptions& options = {});
  at::Tensor forward(const at::Tensor& x);

  // (residual + delta, forward of that): a block's residual add and the norm after it. The fused
  // kernels make it one pass where they take the pair (the sum keeps the residual's dtype);
  // otherwise it is the add and then forward.
  std::pair<at::Tensor, at::Tensor> add_then_forward(const at::Tensor& residual,
                                                     const at::Tensor& delta);

  at::Tensor weight;

 private:
  double eps_;
  Kernels kernels_;
};
TORCH_MODULE(RMSNorm);

// The layer as plain ATen operators: the reference the fused kernel is held to.
at::Tensor rms_norm_composition(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace mltrain
