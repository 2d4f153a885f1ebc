#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "model/llama.h"

namespace mltrain {

// Forward and backward of one micro-batch of windows [B, seq_len + 1] (already on the device):
// its window_loss (precision.h) is divided by grad_accum so that grad_accum calls accumulate the
// gradient of the step's mean loss, and backward runs outside autocast. Returns the divided loss,
// detached.
at::Tensor forward_backward(Llama& model, const at::Tensor& window, int64_t grad_accum,
                            c10::Device device, bool bf16);

}  // namespace mltrain
