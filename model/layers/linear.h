#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

#include "model/kernels/kernels.h"

namespace mltrain {

// The options of every projection in the model: in -> out features, no bias (LLaMA has none).
inline torch::nn::LinearOptions bias_free_linear(int64_t in, int64_t out) {
  return torch::nn::LinearOptions(in, out).bias(false);
}

// x [.., in] @ weight [out, in]^T, as at::linear without a bias. With Kernels::fused_cpu on the
// CPU in fp32 outside autocast, and with Kernels::fused_cuda on CUDA in fp32 or under bf16
// autocast, backward adds the weight's gradient straight into weight.grad() inside its GEMM
// (addmm_, as Megatron's gradient-accumulation fusion; under autocast a bf16 GEMM that writes
// fp32), where the plain path makes a temporary that AccumulateGrad then adds in: one pass over
// every weight per micro-step saved, and under autocast the bf16 gradient's cast too. A .grad
// that is a view into a gradient bucket (dist/grad_reducer.h) so receives the gradient in place,
// and the weight's post-accumulate-grad hook still runs once per backward, after it. The gradient
// reaches .grad only: hooks on the gradient itself (register_hook) and autograd::grad with respect
// to the weight see none; train.kernels: aten (or autocast on the CPU) gives the plain path for
// them. A weight that is not fp32 (ZeRO-3's, gathered in bf16) always takes the plain path.
at::Tensor project(const at::Tensor& x, const at::Tensor& weight, Kernels kernels);

}  // namespace mltrain
