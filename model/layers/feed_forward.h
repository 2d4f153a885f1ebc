#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/kernels/kernels.h"
#include "model/layers/linear.h"
#include "model/layers/lora.h"

namespace mltrain {

// SwiGLU: w_down(silu(w_gate x) * w_up x), with w_gate and w_up one product: w_gate_up holds
// w_gate's rows and then w_up's (Hugging Face's gate_proj and up_proj,
// model/interop/hf_state_dict.h).
class FeedForwardImpl : public torch::nn::Module {
 public:
  // The projections on `options`' device, drawn by the model, with `lora`'s adapters on those of
  // gate, up and down it targets.
  FeedForwardImpl(int64_t d_model, int64_t d_ffn, Kernels kernels,
                  const WeightOptions& options = {}, const LoraConfig& lora = {});
  at::Tensor forward(const at::Tensor& x);

  Matrix w_gate_up;
  Matrix w_down;
  LowRankAdapter w_gate_up_lora{nullptr};  // none without LoRA on gate or up
  LowRankAdapter w_down_lora{nullptr};

 private:
  Kernels kernels_;
};
TORCH_MODULE(FeedForward);

// silu(gate) * up of gate_up [.., 2 d_ffn], gate and then up in its last dimension, into
// [.., d_ffn]: with Kernels::fused_cpu, fused_swiglu (model/kernels/cpu_kernels.h), with
// Kernels::fused_cuda, cuda_swiglu (model/kernels/cuda_kernels.h), where the device and the dtype
// allow it; swiglu_composition otherwise.
at::Tensor swiglu(const at::Tensor& gate_up, Kernels kernels);

// The same as plain ATen operators: the reference of the fused kernel.
at::Tensor swiglu_composition(const at::Tensor& gate_up);

}  // namespace mltrain
