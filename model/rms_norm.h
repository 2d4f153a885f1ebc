#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace mltrain {

// x / sqrt(mean(x^2) + eps) * weight. The statistic is computed in fp32 whatever the input dtype
// (bf16 squares underflow) and the normalised value is cast back before the learnable scale.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

}  // namespace mltrain
