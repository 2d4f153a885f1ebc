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

// What the run loop asks of an optimizer: AdamW over whole parameters (below), or over this
// rank's part of them (ZeRO-1, sharded_adamw.h). Neither touches .grad itself: the gradient
// reducer owns the gradients, which must stay views into its buckets.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Scales the gradients the next step reads so that the global L2 norm of the model's gradient
  // is at most max_norm (0: no clipping), and returns the norm before clipping as a float scalar
  // on the device. As torch.nn.utils.clip_grad_norm_, the scale min(1, max_norm / (norm + 1e-6))
  // is computed and applied on the device: the host never waits for the norm.
  virtual at::Tensor clip_gradients(double max_norm) = 0;

  // One update with learning rate `lr`, unless `skip` (a float scalar on the parameters' device)
  // is 1: then nothing changes, not even the step counts. The decision stays on the device, so
  // that the host need not wait for it.
  virtual void step(double lr, const at::Tensor& skip) = 0;

  // Every parameter's moments and step count, as "<name>.exp_avg", "<name>.exp_avg_sq" and
  // "<name>.step": the same tensors however the state is held, so that a checkpoint resumes on any
  // number of ranks, sharded or not. Where the state is sharded this is a collective that every
  // rank calls, and only rank 0 gets the state (on the CPU); the others get none.
  virtual OptimizerState state() const = 0;

  // Restores a state() of the same parameters (whole, from any sharding); a missing or misshapen
  // entry is a UserError naming `source` and the entry.
  virtual void load_state(const OptimizerState& saved, const std::string& source) = 0;

  // The bytes of optimizer state this rank holds.
  virtual int64_t state_bytes() const = 0;
};

// AdamW (Loshchilov & Hutter) with bias correction and decoupled weight decay, through PyTorch's
// fused multi-tensor kernel (one launch per group, on CUDA and the CPU): tensors in two groups,
// with and without weight decay, and their moments. Every tensor takes every step, so one step
// count serves them all.
class AdamWUpdate {
 public:
  AdamWUpdate(AdamWOptions options, c10::Device device);

  // `value` (a parameter or a part of one) is updated with its moments, all of one shape; weight
  // decay applies when `decay`.
  void add(const at::Tensor& value, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
           bool decay);
  // The gradients the next steps read for the group with or without decay, in the order of add().
  void set_grads(bool decay, std::vector<at::Tensor> grads);

  void step(double lr, const at::Tensor& skip);

  // The steps taken, a float scalar on the device (the fused kernel's step count).
  const at::Tensor& step_count() const { return step_count_; }

 private:
  struct Group {
    std::vector<at::Tensor> values;
    std::vector<at::Tensor> grads;
    std::vector<at::Tensor> exp_avgs;
    std::vector<at::Tensor> exp_avg_sqs;
  };
  Group& group(bool decay) { return decay ? decayed_ : not_decayed_; }

  AdamWOptions options_;
  at::Tensor step_count_;
  Group decayed_;
  Group not_decayed_;
};

// AdamW over a model's parameters, each with its own moments. Weight decay applies to matrices
// (embeddings and projections) and not to vectors (norm weights), as is usual for transformers.
class AdamW : public Optimizer {
 public:
  AdamW(const NamedParameters& parameters, AdamWOptions options);

  at::Tensor clip_gradients(double max_norm) override;
  void step(double lr, const at::Tensor& skip) override;
  OptimizerState state() const override;
  void load_state(const OptimizerState& saved, const std::string& source) override;
  int64_t state_bytes() const override;

 private:
  struct Entry {
    std::string name;
    at::Tensor parameter;
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
  };
  std::vector<Entry> entries_;
  AdamWUpdate update_;
};

// Whether AdamW decays `parameter`: matrices, not vectors.
inline bool decays(const at::Tensor& parameter) { return parameter.dim() >= 2; }

// The saved entry `name` of an optimizer state, checked to have `sizes` elements in that shape;
// a UserError naming `source` otherwise.
const at::Tensor& saved_entry(const OptimizerState& saved, const std::string& name,
                              at::IntArrayRef sizes, const std::string& source);

// Scales the parameters' gradients so that their global L2 norm is at most max_norm (0: no
// clipping) and returns the norm before clipping: Optimizer::clip_gradients for whole parameters.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

// Scales `grads` by min(1, max_norm / (norm + 1e-6)), computed on the device in double (as a host
// max_norm / (norm + 1e-6) would be) and applied in float; max_norm 0 leaves them as they are.
void clip_to_norm(const std::vector<at::Tensor>& grads, const at::Tensor& norm, double max_norm);

}  // namespace mltrain
