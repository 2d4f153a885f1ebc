#pragma once

#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/grad_reducer.h"
#include "trainer/optim/adamw.h"

namespace mltrain {

// AdamW over this rank's part of the parameters (ZeRO-1): the moments of the rank's part of each
// of a sharded GradReducer's buckets, one N-th of the whole, updated from the averaged gradients
// the reducer's reduce-scatter leaves there. The reducer's gather_parameters() then brings every
// rank's updated part to all of them.
//
// A part of a bucket can begin or end inside a parameter, and can hold matrices and vectors alike:
// it is cut at the parameters' edges into pieces, each of one parameter, and each piece goes to
// the group of its parameter, so that weight decay falls on matrices only, exactly as without
// sharding. AdamW works elementwise, so the update of each piece equals the update of those
// elements of the whole parameter.
class ShardedAdamW : public Optimizer {
 public:
  // `parameters` names the reducer's parameters (the same tensors, in any order).
  ShardedAdamW(const NamedParameters& parameters, const GradReducer& reducer,
               Communicator& communicator, AdamWOptions options);

  // The global norm: the sum over the ranks of each part's squared norm.
  at::Tensor clip_gradients(double max_norm) override;
  void step(double lr, const at::Tensor& skip) override;
  // Each bucket's moments are all-gathered on the device, one bucket at a time, and rank 0 keeps
  // them on the CPU: the state as one rank would hold it.
  OptimizerState state() const override;
  // Each rank takes its part of the whole state.
  void load_state(const OptimizerState& saved, const std::string& source) override;
  int64_t state_bytes() const override;

 private:
  struct BucketState {
    const GradReducer::BucketShard* shard;
    std::vector<std::string> names;  // of the bucket's members, in their order
    std::vector<std::vector<int64_t>> sizes;
    at::Tensor exp_avg;  // of the rank's part
    at::Tensor exp_avg_sq;
  };
  at::Tensor gather_bucket(const BucketState& bucket, const at::Tensor& part) const;

  Communicator& communicator_;
  std::vector<BucketState> buckets_;
  std::vector<at::Tensor> gradients_;  // every bucket's part
  AdamWUpdate update_;
};

}  // namespace mltrain
