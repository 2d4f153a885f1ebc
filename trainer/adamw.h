#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <utility>
#include <vector>

#include "model/safetensors.h"

namespace mltrain {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// Which implementation steps the parameters: the fused multi-tensor kernel (one launch for all
// parameters; CUDA and CPU), or a sequence of foreach multi-tensor ops. Both compute AdamW
// (Loshchilov & Hutter) with bias correction and decoupled weight decay.
enum class AdamWKernel { kFused, kForEach };

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// AdamW over a model's parameters. Weight decay applies to matrices (embeddings and projections)
// and not to vectors (norm weights), as is usual for transformers.
class AdamW {
 public:
  AdamW(const NamedParameters& parameters, AdamWOptions options, AdamWKernel kernel);

  // One update with learning rate `lr` from the parameters' .grad().
  void step(double lr);
  void zero_grad();
  int64_t steps() const { return steps_; }

  // The moments and step counts, as "<name>.exp_avg", "<name>.exp_avg_sq" and "<name>.step"
  // (sharing storage with the optimizer).
  NamedTensors state() const;
  // Restores a state() of the same parameters; a missing or misshapen entry is a UserError naming
  // `source` and the entry.
  void load_state(const NamedTensors& saved, const std::string& source);

 private:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    std::vector<at::Tensor> exp_avgs;
    std::vector<at::Tensor> exp_avg_sqs;
    std::vector<at::Tensor> state_steps;  // one float per parameter, as the fused kernel wants
    double weight_decay;
  };
  void fused_step(Group& group, double lr);
  void foreach_step(Group& group, double lr);

  AdamWOptions options_;
  AdamWKernel kernel_;
  std::vector<Group> groups_;
  int64_t steps_ = 0;
};

// Scales the gradients so that their global L2 norm is at most max_norm (0: no clipping) and
// returns the norm before clipping.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace mltrain
