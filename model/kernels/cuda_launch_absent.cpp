// The launches of cuda_launch.h in a build against a CPU-only LibTorch, which has no CUDA to
// compile them with: cuda_kernels_built() is false, so the layers never call them, and a direct
// call is an error.
#include <c10/util/Exception.h>

#include "model/kernels/cuda_launch.h"

namespace mltrain::cuda_launch {
namespace {

[[noreturn]] void refuse() {
  TORCH_CHECK(false, "mltrain was built against a LibTorch without CUDA: it has no CUDA kernels");
}

}  // namespace

bool built() { return false; }

void rms_norm_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  refuse();
}

void rms_norm_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  refuse();
}

void rotary(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool,
            const at::Tensor&) {
  refuse();
}

void swiglu_forward(const at::Tensor&, const at::Tensor&) { refuse(); }

void swiglu_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&) { refuse(); }

void cross_entropy_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&) {
  refuse();
}

void cross_entropy_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  refuse();
}

}  // namespace mltrain::cuda_launch
