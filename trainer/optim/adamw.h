#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "model/layers/named_parameter.h"

namespace mltrain {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// Tensors by name, in the order of the names: what a .safetensors file holds. An optimizer names
// the state of a parameter by its parts (model/layers/named_parameter.h), "<part name>.exp_avg", so
// that a fused projection's state is saved and loaded as that of the projections it holds.
using OptimizerState = std::map<std::string, at::Tensor>;

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

// AdamW over a model's whole parameters, each with its own moments, reading their .grad. Weight
// decay applies to matrices (embeddings and projections) and not to vectors (norm weights), as is
// usual for transformers.
class AdamW {
 public:
  AdamW(const NamedParameters& parameters, AdamWOptions options);

  // One update with learning rate `lr`, unless `skip` (a float scalar on the parameters' device)
  // is 1: then nothing changes, not even the step counts. The decision stays on the device, so
  // that the host need not wait for it.
  void step(double lr, const at::Tensor& skip);

  // Every parameter's moments and step count by part, as "<part>.exp_avg", "<part>.exp_avg_sq" and
  // "<part>.step".
  OptimizerState state() const;
  // Restores a state() of the same parameters; a missing or misshapen entry is a UserError naming
  // `source` and the entry, and then nothing has changed.
  void load_state(const OptimizerState& saved, const std::string& source);
  // The bytes of its moments and step count.
  int64_t state_bytes() const;

 private:
  struct Entry {
    NamedParameter parameter;
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
  };
  std::vector<Entry> entries_;
  AdamWUpdate update_;
};

// The tensors of `parameters`, in their order.
std::vector<at::Tensor> tensors_of(const NamedParameters& parameters);

// Whether AdamW decays `parameter`: matrices, not vectors.
inline bool decays(const at::Tensor& parameter) { return parameter.dim() >= 2; }

// The error of a saved optimizer state whose entry `name` is missing or of another shape.
UserError saved_entry_error(const std::string& source, const std::string& name, bool missing);

// The saved entry `name` of an optimizer state, checked to have `sizes` elements in that shape;
// a UserError naming `source` otherwise.
const at::Tensor& saved_entry(const OptimizerState& saved, const std::string& name,
                              at::IntArrayRef sizes, const std::string& source);

// Adds `tensor`, of `parameter`'s shape (a moment, a momentum), to `state` as "<part><suffix>" for
// each of the parameter's parts: views of its rows.
void add_by_part(OptimizerState& state, const NamedParameter& parameter, const at::Tensor& tensor,
                 std::string_view suffix);

// Checks, as saved_entry does, that `saved` holds "<part><suffix>" of each of `parameter`'s parts
// in the part's shape.
void check_saved_parts(const OptimizerState& saved, const NamedParameter& parameter,
                       std::string_view suffix, const std::string& source);

// Copies each of `parameter`'s saved "<part><suffix>" into its rows of `destination`, a tensor of
// the parameter's shape: no part is joined to another on the way.
void copy_saved_parts(const OptimizerState& saved, const NamedParameter& parameter,
                      std::string_view suffix, const at::Tensor& destination);

}  // namespace mltrain
