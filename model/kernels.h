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
// Fused CUDA kernels will be a third (the GPU issue).
enum class Kernels { aten, fused_cpu };

// train.kernels on `device`: "aten" is aten everywhere; "fused" is fused_cpu on the CPU, and aten
// on CUDA until fused CUDA kernels exist (the CPU's loss chunks are sized for a CPU's caches; on a
// GPU they would be many small launches). Anything else is a UserError.
Kernels choose_kernels(const std::string& name, c10::Device device);

// "aten" or "fused CPU kernels", for the log.
const char* describe(Kernels kernels);

// Whether a layer built with `kernels` runs its fused CPU kernel on `input`: fused_cpu, a CPU
// tensor, and a dtype the kernels take (fp32 or bf16, on a CPU with the vector units they need).
// Otherwise the layer runs its ATen composition, which gives the same values.
bool runs_fused_cpu(Kernels kernels, const at::Tensor& input);
bool runs_fused_cpu(Kernels kernels, c10::Device device, c10::ScalarType dtype);

}  // namespace mltrain
