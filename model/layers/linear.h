#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "model/kernels/kernels.h"

namespace mltrain {

// How a layer's weights are made: on `tensor`'s device, in its dtype, with bytes, or without any
// (their sizes only, the storage empty, as ZeRO-3's freed units are: dist/unit_shards.h gives them
// bytes before anything reads them). With bytes, a layer made on its own draws its matrices as
// torch's Linear does (uniform within 1 / sqrt(columns)) unless `drawn` is false: the model
// draws its own (LlamaImpl::initialize), once.
struct WeightOptions {
  at::TensorOptions tensor = at::kFloat;
  bool bytes = true;
  bool drawn = true;

  // A tensor of `sizes`, its bytes (if any) as the allocator leaves them.
  at::Tensor make(at::IntArrayRef sizes) const;
};

// A module that holds one [rows, columns] matrix, `weight`, and nothing else: a projection's
// ([out, in], applied with project(); LLaMA's have no bias) or the token embedding table
// ([vocab, d_model]).
class MatrixImpl : public torch::nn::Module {
 public:
  MatrixImpl(int64_t rows, int64_t columns, const WeightOptions& options);
  at::Tensor weight;
};
TORCH_MODULE(Matrix);

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
