#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/grad_reducer.h"
#include "dist/unit_shards.h"
#include "model/layers/unit_hooks.h"
#include "trainer/optim/optimizer.h"
#include "trainer/optim/parts_adamw.h"

namespace mltrain {

// ZeRO-3 (dist.zero_stage 3), as FSDP's fully_shard: the weights, the gradients and AdamW's
// state are all sharded, by the model's units (the embedding, each block, the head). Between
// uses a rank holds only its part of each; one step, in order:
//   forward: each unit's weights all-gathered just before it runs and freed after, the next
//     unit's gathered while it computes (dist/unit_shards.h, through the model's unit hooks);
//   backward: each unit's weights gathered again before its backward (the previous unit's on
//     their way), and once backward has given all its gradients they are reduce-scattered (the
//     reducer's released buckets, one per unit) and its weights freed;
//   reduce_gradients(): the last reduce-scatters waited for;
//   update(): AdamW on this rank's parts of the weights (parts_adamw.h); nothing is gathered, as
//     the next forward gathers each unit when it runs.
// Under bf16 autocast (options.gather_bf16) the units are gathered and run in bf16, cast once
// from the fp32 parts, and their bf16 gradients are added into the reducer's fp32 buckets, then
// reduce-scattered in dist.grad_dtype; AdamW updates the fp32 parts.
// Every micro-step of gradient accumulation is reduce-scattered, as under ZeRO-2 (grad_reducer.h
// says why). A recomputed block (activation checkpointing) runs inside its backward, when its
// weights are whole.
class Zero3AdamW : public Optimizer {
 public:
  // `units`: the parameters each of the model's units reads, in forward order
  // (LlamaImpl::unit_parameters()); units that share a tensor (a tied embedding) are one unit.
  Zero3AdamW(const NamedParameters& parameters, const UnitParameters& units,
             Communicator& communicator, const DataParallelOptions& options);

  void set_sync(bool last_micro_step) override;
  ReducedGradients reduce_gradients() override;
  void update(double lr, const at::Tensor& skip) override;
  OptimizerState state() const override { return adamw_.state(); }
  std::optional<SafetensorsShare> state_share() const override { return adamw_.state_share(); }
  bool load_own_state(const SafetensorsReader& file, const std::string& source) override {
    adamw_.load_own_state(file, source);
    return true;
  }
  // This rank's part of each unit's weights: what it alone holds of them.
  std::optional<SafetensorsShare> weights_share() const override;
  void load_state(const OptimizerState& saved, const std::string& source) override {
    adamw_.load_state(saved, source);
  }
  int64_t state_bytes() const override { return adamw_.state_bytes(); }

  std::shared_ptr<UnitHooks> unit_hooks() override { return hooks_; }
  void make_weights_whole() override { shards_->make_whole(); }
  void shard_weights() override { shards_->shard(); }
  std::vector<at::Tensor> weight_parts() const override;
  void fill_weights(const std::vector<at::Tensor>& /*parameters*/,
                    const WeightsFill& fill) override {
    shards_->fill(fill);
  }

  const UnitShards& shards() const { return *shards_; }
  UnitShards& shards() { return *shards_; }
  const std::vector<PartsAdamW::Part>& parts() const { return adamw_.parts(); }

 private:
  size_t bucket_of(size_t unit) const { return shards_->units() - 1 - unit; }
  std::vector<PartsAdamW::Part> parts_of_units() const;

  Communicator& communicator_;
  // Shared with the hooks, which the model may hold longer than the optimizer lives.
  std::shared_ptr<UnitShards> shards_;
  GradReducer reducer_;  // one released bucket per unit, in backward's order: the last unit first
  PartsAdamW adamw_;
  std::shared_ptr<UnitHooks> hooks_;
  bool reduced_ = false;  // reduce_gradients() ran since the last update()
};

}  // namespace mltrain
