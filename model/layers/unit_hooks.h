#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace mltrain {

// The points where sharding (ZeRO-3) reaches into the model from outside it, as torchtitan's
// fully_shard does: the model runs in units, each a span of its forward that reads a known set of
// parameters (LlamaImpl::unit_parameters()), and calls the hooks around each. The model never
// knows what they do; without hooks it runs as it always did.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Before unit `position` (in forward order) reads its parameters.
  virtual void before_forward(size_t position) = 0;
  // After it, with its output, which the hooks return (they may attach a hook that runs before
  // the unit's backward), and whether its backward reads its parameters: the embedding's does not
  // (its gradient is the output's, added up by token).
  virtual at::Tensor after_forward(size_t position, const at::Tensor& output,
                                   bool backward_reads_parameters) = 0;
};

// The parameters each unit reads, in forward order. A tensor may be read by several units (a tied
// embedding, by the first and the last).
using UnitParameters = std::vector<std::vector<at::Tensor>>;

}  // namespace mltrain
