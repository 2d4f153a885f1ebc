#include "trainer/train_step.h"

#include <ATen/ATen.h>

#include "trainer/precision.h"

namespace mltrain {

at::Tensor forward_backward(Llama& model, const at::Tensor& window, int64_t grad_accum,
                            c10::Device device, bool bf16) {
  const int64_t length = window.size(1) - 1;
  at::Tensor loss;
  {
    AutocastGuard autocast(device, bf16);
    loss = next_token_loss(model(window.narrow(1, 0, length)), window.narrow(1, 1, length)) /
           static_cast<double>(grad_accum);
  }
  loss.backward();
  return loss.detach();
}

}  // namespace mltrain
