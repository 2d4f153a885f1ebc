#pragma once

#include <string>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"
#include "dist/grad_reducer.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/optimizer.h"

namespace mltrain {

// ZeRO-1, as llm.c and DeepSpeed's stage 1 do it: each rank holds AdamW's moments for one N-th of
// the parameters. One step, in order:
//   1. reduce_gradients(): the reducer reduce-scatters the gradients, bucket by bucket, so that
//      each rank receives the average of its own part of each bucket only (ZeRO-2, with
//      options.shard_gradients: every micro-step's, as backward completes each bucket, so that a
//      rank keeps its part of the gradients and never the whole);
//   2. update(): AdamW updates this rank's part of the weights from it,
//   3. and all-gathers every rank's updated part to every rank.
//
// For 3 to need no copies, the parameters live in flat buckets of the reducer's layout: each
// parameter becomes a view into its bucket (set_data), keeping its identity for the model, autograd
// and the checkpoints. A bucket is padded with zeros to a multiple of the ranks.
//
// A part of a bucket can begin or end inside a parameter, and can hold matrices and vectors alike:
// it is cut at the parameters' edges into pieces, each of one parameter, and each piece goes to
// the AdamW group of its parameter, so that weight decay falls on matrices only, exactly as
// without sharding. AdamW works elementwise, so the update of each piece equals the update of
// those elements of the whole parameter.
class Zero1AdamW : public Optimizer {
 public:
  Zero1AdamW(const NamedParameters& parameters, Communicator& communicator,
             const DataParallelOptions& options);

  void set_sync(bool last_micro_step) override { reducer_.set_sync(last_micro_step); }
  ReducedGradients reduce_gradients() override;
  void update(double lr, const at::Tensor& skip) override;
  // Each bucket's moments are all-gathered on the device, one bucket at a time, and rank 0 keeps
  // them on the CPU: the state as one rank would hold it.
  OptimizerState state() const override;
  // Each rank takes its part of the whole state.
  void load_state(const OptimizerState& saved, const std::string& source) override;
  int64_t state_bytes() const override;

  // This rank's part of each bucket, in the order of the buckets (for the tests and the plan).
  struct Part {
    int64_t begin = 0;     // its first element in the bucket
    at::Tensor weights;    // this rank's part of the bucket's weights
    at::Tensor gradients;  // the average of the part's gradients, after reduce_gradients()
    at::Tensor exp_avg;    // AdamW's moments of the part
    at::Tensor exp_avg_sq;
  };
  const std::vector<Part>& parts() const { return parts_; }

 private:
  struct Bucket {
    BucketLayout layout;
    at::Tensor weights;  // the whole bucket's weights: every parameter of it is a view here
  };
  static std::vector<Bucket> lay_out(const std::vector<at::Tensor>& parameters, BucketSizes sizes,
                                     int ranks);
  const NamedParameter& member(const Bucket& bucket, size_t k) const {
    return named_[bucket.layout.members[k]];
  }
  void move_into_buckets();
  void add_pieces_to_update(const Bucket& bucket, const Part& part);
  at::Tensor gather_bucket(const Bucket& bucket, const Part& part, const at::Tensor& values) const;
  void check_parameters_in_buckets() const;

  Communicator& communicator_;
  NamedParameters named_;
  std::vector<at::Tensor> parameters_;  // named_'s tensors
  std::vector<Bucket> buckets_;
  GradReducer reducer_;  // the gradients' side: the same layout, reduce-scattered
  std::vector<Part> parts_;
  AdamWUpdate update_;
  std::vector<at::Tensor> decayed_grads_;  // the pieces' gradients, in the order of add()
  std::vector<at::Tensor> other_grads_;
  bool reduced_ = false;  // reduce_gradients() ran since the last update()
};

}  // namespace mltrain
