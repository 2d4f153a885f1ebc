#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace mltrain {

// fn(input), recorded for autograd without fn's intermediate activations: the forward pass runs fn
// without a graph and keeps only its input, and backward runs fn again, with a graph, to
// differentiate it (LibTorch's C++ API has no torch.utils.checkpoint). Memory for one call's
// activations at a time, for a second forward pass of fn in backward.
//
// `parameters` are every tensor fn reads that may need a gradient other than `input` (a module's
// parameters()): they are inputs of the recorded node, so that their gradients reach them through
// the outer graph, where AccumulateGrad and the post-accumulate-grad hooks of the gradient reducer
// run once per backward, as without checkpointing. Parameters that do not require grad are skipped.
//
// The recomputation sees what the forward pass saw: the autocast settings of input's device type
// (backward runs outside autocast), and the generators' states (the CPU default generator's, and
// input's device's), so that random ops draw the same numbers. It leaves both as it found them:
// the generators where they were, and, outside any autocast region, no cached casts of weights.
// fn must be deterministic otherwise, and must not modify its input. Differentiable once: backward
// with create_graph builds no graph through fn.
at::Tensor checkpointed(const std::function<at::Tensor(const at::Tensor&)>& fn,
                        const at::Tensor& input, const std::vector<at::Tensor>& parameters);

}  // namespace mltrain
