#include "model/kernel_choice.h"

#include <fmt/format.h>

#include <atomic>

#include "common/error.h"

namespace mltrain {
namespace {

// Process-wide like ATen's own kernel switches (at::globalContext()): the layers read it on every
// forward pass, from whichever thread runs the model.
std::atomic<KernelChoice> current_choice{KernelChoice::fused};

}  // namespace

void set_kernel_choice(KernelChoice choice) { current_choice.store(choice); }

KernelChoice kernel_choice() { return current_choice.load(); }

KernelChoice parse_kernel_choice(const std::string& name) {
  if (name == "fused") return KernelChoice::fused;
  if (name == "aten") return KernelChoice::aten;
  throw UserError(fmt::format("train.kernels is fused or aten, not '{}'", name));
}

bool use_fused_cpu_kernel(const at::Tensor& input) {
  return kernel_choice() != KernelChoice::aten && input.device().is_cpu();
}

bool use_chunked_loss(const at::Tensor& hidden) {
  return kernel_choice() != KernelChoice::aten && hidden.device().is_cpu();
}

}  // namespace mltrain
