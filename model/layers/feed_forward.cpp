#include "model/layers/feed_forward.h"

#include <ATen/ATen.h>

#include <vector>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/cuda_kernels.h"
#include "model/layers/linear.h"

namespace mltrain {

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t d_ffn, Kernels kernels,
                                 const WeightOptions& options, const LoraConfig& lora)
    : w_gate_up(register_module("w_gate_up", Matrix(2 * d_ffn, d_model, options))),
      w_down(register_module("w_down", Matrix(d_model, d_ffn, options))),
      kernels_(kernels) {
  w_gate_up_lora = adapter_for(d_model, {{"gate", d_ffn}, {"up", d_ffn}}, lora, options);
  if (w_gate_up_lora) register_module("w_gate_up_lora", w_gate_up_lora);
  w_down_lora = adapter_for(d_ffn, {{"down", d_model}}, lora, options);
  if (w_down_lora) register_module("w_down_lora", w_down_lora);
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  const at::Tensor gate_up = adapted(w_gate_up_lora, x, project(x, w_gate_up->weight, kernels_));
  const at::Tensor hidden = swiglu(gate_up, kernels_);
  return adapted(w_down_lora, hidden, project(hidden, w_down->weight, kernels_));
}

at::Tensor swiglu(const at::Tensor& gate_up, Kernels kernels) {
  if (runs_fused_cpu(kernels, gate_up)) return fused_swiglu(gate_up);
  if (runs_fused_cuda(kernels, gate_up)) return cuda_swiglu(gate_up);
  return swiglu_composition(gate_up);
}

at::Tensor swiglu_composition(const at::Tensor& gate_up) {
  // Halves as views: backward joins their gradients in one copy (chunk's backward is a cat).
  const std::vector<at::Tensor> halves = gate_up.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

}  // namespace mltrain
