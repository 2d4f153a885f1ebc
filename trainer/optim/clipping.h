#pragma once

#include <ATen/Tensor.h>

#include "trainer/optim/optimizer.h"

namespace mltrain {

// Scales the gradients so that their global L2 norm is at most max_norm (0: no clipping), and
// returns the norm before clipping as a float scalar on the device. As
// torch.nn.utils.clip_grad_norm_, the scale min(1, max_norm / (norm + 1e-6)) is computed and
// applied on the device: the host never waits for the norm. Where each rank holds a part of the
// gradients (ZeRO-1), the norm sums the parts' squares over the ranks.
at::Tensor clip_by_global_norm(const ReducedGradients& gradients, double max_norm);

}  // namespace mltrain
