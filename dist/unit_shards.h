#pragma once

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"

namespace mltrain {

// ZeRO-3's weights, as FSDP holds them: each unit's parameters as one flat tensor of the unit's
// layout (lay_out_units), cut into one equal part per rank. A rank keeps its own part of every
// unit always, and a unit's whole tensor only while the unit runs: all-gathered from every rank's
// part just before its forward and again before its backward, and freed after each.
//
// The parameters are views into their unit's whole tensor all along, so that the model, autograd
// and the checkpoints see the same tensors as without sharding. Freed, a whole tensor keeps its
// storage object with no bytes in it (FSDP's storage resize_(0)); gathered again, the same storage
// gets bytes again, so that what autograd saved of a weight in forward reads it in backward.
//
// The parts stay fp32, which the optimizer updates. With a gather dtype of bf16 (under bf16
// autocast, as FSDP's param_dtype), each rank casts its part once per gather and the unit is
// all-gathered, and computed with, in bf16: half the bytes on the wire and in flight, and the
// parameters are bf16 views while the ranks train, so that autocast casts none of them and no
// rank keeps a bf16 copy of the model from forward to backward. Their gradients come in bf16 and
// are reduced in the reducer's own dtype. Kept whole (make_whole), the parameters are fp32 views
// of an fp32 whole tensor, gathered exactly, for what reads or writes the model as it is kept.
//
// `order` gives the unit of each position the model runs in forward (unit_hooks.h). While one
// position computes, the next position's unit is all-gathered (in backward, the previous one's):
// at most two units are whole at once, besides a unit read at several positions (a tied
// embedding), which stays whole from its first position to the end of its backward. The
// optimizer updates the parts; nothing is gathered after the update, as the next forward gathers
// each unit when it needs it.
class UnitShards {
 public:
  // `units`: one layout per unit, its members indices into `parameters`, padded to a multiple of
  // the ranks. Each parameter's current values (every rank's the same) become this rank's parts;
  // the weights stay whole, as after make_whole(), until shard(). Parameters made without bytes
  // (their storage empty: LlamaImpl::Weights::none) have no values: the parts start at zero and
  // the weights sharded, the parameters as they were made, until fill() gives them their values
  // and makes them views of their units; nothing is gathered before.
  UnitShards(std::vector<at::Tensor> parameters, std::vector<BucketLayout> units,
             std::vector<size_t> order, Communicator& communicator,
             at::ScalarType gather_dtype = at::kFloat);
  ~UnitShards();
  UnitShards(const UnitShards&) = delete;
  UnitShards& operator=(const UnitShards&) = delete;

  size_t units() const { return units_.size(); }
  const BucketLayout& layout(size_t unit) const { return units_.at(unit).layout; }
  // This rank's part of `unit`'s flat weights: what the optimizer updates, in place.
  const at::Tensor& part(size_t unit) const { return units_.at(unit).part; }
  // The part's first element in the unit's flat tensor.
  int64_t part_begin(size_t unit) const;

  // The model's hooks, by position in `order`. Before a position's forward: its unit whole, and
  // the next position's on its way.
  void before_forward(size_t position);
  // After it: its unit freed, unless a later position reads it too, or backward begins here
  // (`backward_follows` at the last position). A position whose backward reads no weights
  // (`backward_reads`: the embedding's, whose gradient needs only the tokens) is not gathered in
  // backward: an untied embedding is all-gathered once a micro-step, not twice.
  void after_forward(size_t position, bool backward_follows, bool backward_reads = true);
  // Before a position's backward: its unit whole, and the previous position's on its way where
  // its backward reads it.
  void before_backward(size_t position);
  // Once backward has given every gradient of `unit`: nothing reads its whole weights any more.
  void release(size_t unit);
  // Every unit freed: at the end of a step's backward, whatever it reached.
  void release_all();

  // Every unit whole on every rank, and kept so (the hooks do nothing), until shard(): between
  // steps, to save, load or evaluate the whole model. A collective.
  void make_whole();
  // Each rank's parts taken from the whole weights (a load may have written into them; every
  // rank's are the same), then every unit freed.
  void shard();
  bool whole() const { return kept_whole_; }

  // Writes the weights through `fill`, called once per unit with the unit's parameters, which it
  // is to give their values (the same on every rank: drawn from the model's seed, or read from a
  // file): the unit whole in fp32 meanwhile, then rank 0's values broadcast (within the group,
  // under hybrid sharding) and each rank's part taken, and the unit freed. So at most one unit is
  // ever whole, where building or loading the whole model and then cutting it would hold all of
  // them (the set-up's initial draw or load, a rollback's). Where `fill` throws on any rank, every
  // rank throws before the unit's part changes (the other ranks' error says another rank failed).
  // Kept whole, the parameters are written in place, with no broadcast. A collective; `fill` runs
  // under the shards' lock and so must not run the model.
  using Fill = std::function<void(const std::vector<at::Tensor>& parameters)>;
  void fill(const Fill& fill);
  // The dtype the units are all-gathered and computed in while the ranks train.
  at::ScalarType gather_dtype() const { return gather_dtype_; }

  // Whether `unit`'s all-gather is in flight: started, not yet waited for.
  bool gathering(size_t unit) const { return units_.at(unit).gathering != nullptr; }
  // The all-gathers started since the shards were made.
  int64_t gathers() const;
  // How many units are whole now, and the most that were at once since reset_most_whole().
  int64_t whole_units() const;
  int64_t most_whole_units() const;
  void reset_most_whole_units();

 private:
  struct Unit {
    BucketLayout layout;
    at::Tensor whole;  // the unit's flat weights in the gather dtype; without bytes while freed
    at::Tensor part;   // this rank's part, fp32, apart from `whole`
    // Kept whole with a gather dtype other than the parts': the unit's flat fp32 weights, which
    // the parameters view until shard().
    at::Tensor kept;
    std::unique_ptr<CollectiveWork> gathering;  // the all-gather in flight, if any
    bool has_bytes = false;
  };

  void give_bytes(Unit& unit);
  void gather(size_t unit);
  void wait_whole(size_t unit);
  void free(Unit& unit);
  void view_freed(Unit& unit);
  void view_parameters(const Unit& unit, const at::Tensor& flat);
  bool casts() const { return gather_dtype_ != at::kFloat; }
  bool read_after(size_t position) const;
  bool read_twice(size_t unit) const;

  std::vector<at::Tensor> parameters_;
  std::vector<Unit> units_;
  std::vector<size_t> order_;
  Communicator& communicator_;
  at::ScalarType gather_dtype_;
  bool kept_whole_ = true;
  std::optional<size_t> deferred_gather_;  // backward's prefetch, once the unit after goes
  std::vector<bool> backward_reads_;       // by position, as the last forward said
  int64_t gathers_ = 0;
  int64_t most_whole_ = 0;
  mutable std::mutex mutex_;  // backward's hooks may run on autograd's device threads
};

}  // namespace mltrain
