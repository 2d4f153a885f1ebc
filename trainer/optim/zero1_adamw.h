#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"
#include "dist/grad_reducer.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/optimizer.h"
#include "trainer/optim/parts_adamw.h"

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
// and the checkpoints. A bucket is padded with zeros to a multiple of the ranks. AdamW updates
// this rank's part of each bucket in place (parts_adamw.h).
class Zero1AdamW : public Optimizer {
 public:
  Zero1AdamW(const NamedParameters& parameters, Communicator& communicator,
             const DataParallelOptions& options);

  void set_sync(bool last_micro_step) override { reducer_.set_sync(last_micro_step); }
  ReducedGradients reduce_gradients() override;
  void update(double lr, const at::Tensor& skip) override;
  // The state as one rank would hold it, on rank 0 (parts_adamw.h).
  OptimizerState state() const override { return adamw_.state(); }
  std::optional<SafetensorsShare> state_share() const override { return adamw_.state_share(); }
  bool load_own_state(const SafetensorsReader& file, const std::string& source) override {
    adamw_.load_own_state(file, source);
    return true;
  }
  // Each rank takes its part of the whole state.
  void load_state(const OptimizerState& saved, const std::string& source) override {
    adamw_.load_state(saved, source);
  }
  int64_t state_bytes() const override { return adamw_.state_bytes(); }

  // This rank's part of each bucket, in the order of the buckets (for the tests and the plan).
  using Part = PartsAdamW::Part;
  const std::vector<Part>& parts() const { return adamw_.parts(); }

 private:
  struct Bucket {
    BucketLayout layout;
    at::Tensor weights;  // the whole bucket's weights: every parameter of it is a view here
  };
  static std::vector<Bucket> move_into_buckets(const std::vector<at::Tensor>& parameters,
                                               BucketSizes sizes, int ranks);
  std::vector<PartsAdamW::Part> parts_of_buckets() const;
  void check_parameters_in_buckets() const;

  Communicator& communicator_;
  std::vector<at::Tensor> parameters_;
  std::vector<Bucket> buckets_;
  GradReducer reducer_;  // the gradients' side: the same layout, reduce-scattered
  PartsAdamW adamw_;
  bool reduced_ = false;  // reduce_gradients() ran since the last update()
};

}  // namespace mltrain
