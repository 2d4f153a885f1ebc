#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"
#include "model/interop/safetensors.h"
#include "model/layers/unit_hooks.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/muon.h"

namespace mltrain {

// The gradients an update reads, averaged over the ranks: every parameter's whole gradient, or,
// under ZeRO-1, this rank's part of them, whose global norm is a sum over `ranks`.
struct ReducedGradients {
  std::vector<at::Tensor> tensors;
  Communicator* ranks = nullptr;  // set when each rank holds a part only
};

// A data-parallel rank's optimizer, used in the order of a training step (run/train_step.h):
// each micro-step's backward, with set_sync(true) before the last one; reduce_gradients(); the
// caller clips what it returns (clipping.h); update(). Implementations: AdamW on every rank with
// all-reduced gradients (replicated_adamw.h), AdamW under ZeRO-1 and ZeRO-2 (zero1_adamw.h) and
// ZeRO-3 (zero3_adamw.h), and Muon with AdamW, replicated or sharded by matrix
// (muon_optimizer.h).
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Whether the coming backward is the step's last: only its gradients are averaged over the
  // ranks, as backward produces them.
  virtual void set_sync(bool last_micro_step) = 0;

  // Waits until the step's gradients are averaged over the ranks, and returns what update() reads.
  virtual ReducedGradients reduce_gradients() = 0;

  // The update with learning rate `lr` (AdamW's), unless `skip` (a float scalar on the parameters'
  // device) is 1: then no weight and no moment changes. Every rank ends with the same weights, and
  // gradients at zero for the next step.
  virtual void update(double lr, const at::Tensor& skip) = 0;

  // The optimizer's state by name: AdamW's moments and step count of a parameter as
  // "<name>.exp_avg", "<name>.exp_avg_sq" and "<name>.step", Muon's momentum as "<name>.momentum";
  // the same tensors however the state is held, so that a checkpoint resumes on any
  // number of ranks, sharded or not. Where the state is sharded this is a collective that every
  // rank calls, and only rank 0 gets the state (on the CPU); the others get none.
  virtual OptimizerState state() const = 0;

  // Restores a state() of the same parameters (whole, from any sharding); a missing or misshapen
  // entry is a UserError naming `source` and the entry.
  virtual void load_state(const OptimizerState& saved, const std::string& source) = 0;

  // What this rank writes of a checkpoint where it holds parts that no other rank holds (ZeRO):
  // its own pieces of the weights (named as hf_state_dict names them) and of state(), with every
  // entry of each file, found without gathering anything. None where every rank holds the same
  // (rank 0 writes the whole) or where the state is whole only gathered (Muon's).
  virtual std::optional<SafetensorsShare> weights_share() const { return std::nullopt; }
  virtual std::optional<SafetensorsShare> state_share() const { return std::nullopt; }

  // Where this rank holds parts of the state that no other rank holds (ZeRO): reads only those
  // from a checkpoint's optimizer.safetensors, checked as load_state checks a whole state (nothing
  // changes unless every entry is there in its shape), and returns true. False, reading nothing,
  // where it takes the whole state (load_state).
  virtual bool load_own_state(const SafetensorsReader& /*file*/, const std::string& /*source*/) {
    return false;
  }

  // The bytes of optimizer state this rank holds.
  virtual int64_t state_bytes() const = 0;

  // ZeRO-3's (zero3_adamw.h), which holds each rank's part of the weights only, whole only while
  // a unit of the model runs: the hooks the model calls around its units
  // (model/layers/unit_hooks.h), or none where the weights are always whole.
  virtual std::shared_ptr<UnitHooks> unit_hooks() { return nullptr; }
  // Every parameter whole on every rank (a collective), and kept so until shard_weights(), which
  // takes each rank's part from what they then hold (a load may have written into them): around
  // what reads or writes the whole model between steps. Nothing where the weights are whole.
  virtual void make_weights_whole() {}
  virtual void shard_weights() {}

  // Gives the weights their values through `fill`, called with the parameters it is to write
  // (the same values on every rank: drawn from the model's seed, or read from a file): all of
  // `parameters` (the model's) at once where every rank holds the whole weights; under ZeRO-3 a
  // unit at a time, each rank keeping its part (dist/unit_shards.h's fill), so that the set-up
  // and a rollback hold one unit whole, not the model.
  using WeightsFill = std::function<void(const std::vector<at::Tensor>& parameters)>;
  // ZeRO-3's: this rank's part of each unit's weights; none where the weights are whole.
  virtual std::vector<at::Tensor> weight_parts() const { return {}; }
  virtual void fill_weights(const std::vector<at::Tensor>& parameters, const WeightsFill& fill) {
    fill(parameters);
  }
};

// The whole weights for as long as it lives (Optimizer::make_weights_whole), then each rank's
// part of them again.
class WholeWeights {
 public:
  explicit WholeWeights(Optimizer& optimizer) : optimizer_(optimizer) {
    optimizer_.make_weights_whole();
  }
  ~WholeWeights();
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;

 private:
  Optimizer& optimizer_;
};

struct DataParallelOptions {
  BucketSizes buckets;
  bool overlap = true;         // reduce each bucket while backward runs (grad_reducer.h)
  bool compress_bf16 = false;  // gradients travel as bf16
  bool zero1 = false;          // shard the optimizer state over the ranks (ZeRO-1)
  // With zero1, AdamW's: keep only this rank's part of the gradients too (ZeRO-2), each bucket's
  // whole gradients only until it is reduce-scattered (grad_reducer.h's released buckets).
  bool shard_gradients = false;
  // AdamW's: shard the weights too (ZeRO-3), by the model's units (make_optimizer's `units`).
  bool shard_weights = false;
  // With shard_weights, under bf16 autocast: each unit all-gathered, and computed with, in bf16
  // (dist/unit_shards.h).
  bool gather_bf16 = false;
  AdamWOptions adamw;
  // Muon for the blocks' matrices (muon_optimizer.h), at muon_lr_ratio times AdamW's learning
  // rate; none: AdamW for everything.
  std::optional<MuonOptions> muon;
  double muon_lr_ratio = 1.0;
};

// The optimizer of `parameters` (a model's, by name) on the ranks of `communicator`; `units`, the
// parameters of each of the model's units, only with options.shard_weights.
std::unique_ptr<Optimizer> make_optimizer(const NamedParameters& parameters,
                                          Communicator& communicator,
                                          const DataParallelOptions& options,
                                          const UnitParameters& units = {});

}  // namespace mltrain
