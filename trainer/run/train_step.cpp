#include "trainer/run/train_step.h"

#include <ATen/ATen.h>

#include "trainer/machine/precision.h"

namespace mltrain {

at::Tensor forward_backward(Llama& model, const at::Tensor& window, int64_t grad_accum,
                            c10::Device device, bool bf16) {
  const at::Tensor loss =
      window_loss(model, window, device, bf16) / static_cast<double>(grad_accum);
  loss.backward();
  return loss.detach();
}

}  // namespace mltrain
