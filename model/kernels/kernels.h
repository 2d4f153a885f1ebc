#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

namespace mltrain {

// Which implementation the model's layers and its loss run, chosen when the model is built and
// held by each layer:
// - aten: the plain ATen composition of each layer, and the loss over whole logits. It runs on
//   every device, and is the reference the fused kernels are tested and benchmarked against.
// - fused_cpu: mltrain's CPU kernels (cpu_kernels.h): RMSNorm, RoPE and SwiGLU as vectorised
//   kernels behind autograd functions, the projections' weight gradients added into .grad inside
//   their GEMMs (linear.h), and the loss as cross-entropy through the output projection in chunks
//   of rows (linear_cross_entropy.h), so that the [B, T, V] logits are never held whole.
// - fused_cuda: mltrain's CUDA kernels (cuda_kernels.h): RMSNorm, RoPE and SwiGLU behind
//   autograd functions, and the loss as one pass over the whole logits in their dtype, which the
//   GPU holds (the CPU's chunks are sized for a CPU's caches; on a GPU they would be many small
//   launches).
enum class Kernels { aten, fused_cpu, fused_cuda };

// train.kernels on `device`:
// - "auto", the default: fused_cpu on the CPU, and aten on CUDA until the CUDA kernels have passed
//   their tests on a GPU (tests/gpu/cuda_kernels_test.cpp);
// - "fused": the same; the name of the default before the CUDA kernels, which the configs of runs
//   saved then hold, so that resuming one keeps the layers it trained with;
// - "fused_cuda": fused_cpu on the CPU, fused_cuda on CUDA (a UserError in a build without them);
// - "aten": aten everywhere.
// Anything else is a UserError.
Kernels choose_kernels(const std::string& name, c10::Device device);

// "aten", "fused CPU kernels" or "fused CUDA kernels", for the log.
const char* describe(Kernels kernels);

// Whether a layer built with `kernels` runs its fused CPU kernel on `input`: fused_cpu, a CPU
// tensor, and a dtype the kernels take (fp32 or bf16, on a CPU with the vector units they need).
// Otherwise the layer runs its ATen composition, which gives the same values.
bool runs_fused_cpu(Kernels kernels, const at::Tensor& input);
bool runs_fused_cpu(Kernels kernels, c10::Device device, c10::ScalarType dtype);

// The same for fused_cuda: a CUDA tensor of fp32 or bf16.
bool runs_fused_cuda(Kernels kernels, const at::Tensor& input);
bool runs_fused_cuda(Kernels kernels, c10::Device device, c10::ScalarType dtype);

// Whether either runs: the fused kernels take the rotary tables in fp32, where the compositions
// take them in the activations' dtype.
bool runs_fused(Kernels kernels, c10::Device device, c10::ScalarType dtype);

}  // namespace mltrain
