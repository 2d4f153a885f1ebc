#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mltrain {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;
// Tensors by name, in the order of the names: what a .safetensors file holds.
using OptimizerState = std::map<std::string, at::Tensor>;

// AdamW (Loshchilov & Hutter) with bias correction and decoupled weight decay, over a model's
// parameters, through PyTorch's fused multi-tensor kernel (one launch for all parameters, on CUDA
// and the CPU). Weight decay applies to matrices (embeddings and projections) and not to vectors
// (norm weights), as is usual for transformers. The optimizer never touches .grad itself: the
// gradient reducer owns the gradients, which must stay views into its buckets.
class AdamW {
 public:
  AdamW(const NamedParameters& parameters, AdamWOptions options);

  // One update with learning rate `lr` from the parameters' .grad(), unless `skip` (a float
  // scalar on the parameters' device) is 1: then nothing changes, not even the step counts. The
  // decision stays on the device, so that the host need not wait for it.
  void step(double lr, const at::Tensor& skip);

  // The moments and step counts, as "<name>.exp_avg", "<name>.exp_avg_sq" and "<name>.step"
  // (sharing storage with the optimizer).
  OptimizerState state() const;
  // Restores a state() of the same parameters; a missing or misshapen entry is a UserError naming
  // `source` and the entry.
  void load_state(const OptimizerState& saved, const std::string& source);

 private:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    std::vector<at::Tensor> exp_avgs;
    std::vector<at::Tensor> exp_avg_sqs;
    std::vector<at::Tensor> state_steps;  // one float per parameter, as the fused kernel wants
    double weight_decay;
  };
  AdamWOptions options_;
  std::vector<Group> groups_;
};

// Scales the gradients so that their global L2 norm is at most max_norm (0: no clipping) and
// returns the norm before clipping, as a float scalar on the gradients' device. As
// torch.nn.utils.clip_grad_norm_, the scale min(1, max_norm / (norm + 1e-6)) is computed and
// applied on the device: the host never waits for the norm.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace mltrain
