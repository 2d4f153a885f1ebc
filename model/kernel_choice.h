#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace mltrain {

// Which implementation the model's layers run (train.kernels): mltrain's fused kernels, the
// default, or the plain ATen composition of each layer, kept as the reference the fused kernels
// are tested and benchmarked against. Fused means: RMSNorm, RoPE and SwiGLU as vectorised CPU
// kernels behind autograd functions, the projections' weight gradients added into .grad inside
// their GEMMs (linear.h), and the loss as cross-entropy through the output projection in chunks
// of rows, so that the full [B, T, V] logits are never held. All are CPU paths: on CUDA
// the layers and the loss stay plain until a device has measured the fused versions (the loss's
// chunks are sized for a CPU's caches; on a GPU they would be many small launches). Set once, by
// the trainer, before the first forward pass; the tests set it per case.
enum class KernelChoice { fused, aten };

void set_kernel_choice(KernelChoice choice);
KernelChoice kernel_choice();

// "fused" or "aten" (train.kernels) -> the choice; throws UserError for anything else.
KernelChoice parse_kernel_choice(const std::string& name);

// Whether a layer given this input runs its fused kernel. The fused elementwise kernels are CPU
// kernels: on another device every layer runs its ATen composition.
bool use_fused_cpu_kernel(const at::Tensor& input);

// Whether the loss of hidden states on this device is computed in chunks through the output
// projection (linear_cross_entropy.h).
bool use_chunked_loss(const at::Tensor& hidden);

// Restores the previous choice when it ends: for tests that compare both paths.
class KernelChoiceGuard {
 public:
  explicit KernelChoiceGuard(KernelChoice choice) : previous_(kernel_choice()) {
    set_kernel_choice(choice);
  }
  ~KernelChoiceGuard() { set_kernel_choice(previous_); }
  KernelChoiceGuard(const KernelChoiceGuard&) = delete;
  KernelChoiceGuard& operator=(const KernelChoiceGuard&) = delete;

 private:
  KernelChoice previous_;
};

}  // namespace mltrain
