#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"
#include "model/interop/safetensors.h"
#include "model/layers/named_parameter.h"
#include "trainer/optim/adamw.h"

namespace mltrain {

// AdamW over this rank's part of flat buckets of parameters: ZeRO-1's and ZeRO-2's buckets
// (zero1_adamw.h), ZeRO-3's units (zero3_adamw.h). Each bucket is cut into one equal part per
// rank, and this rank updates its own part of the weights from its part of the averaged gradients.
//
// A part can begin or end inside a parameter, and can hold matrices and vectors alike: it is cut at
// the parameters' edges into pieces, each of one parameter, and each piece goes to the AdamW group
// of its parameter, so that weight decay falls on matrices only, exactly as without sharding.
// AdamW works elementwise, so the update of each piece equals the update of those elements of the
// whole parameter.
class PartsAdamW {
 public:
  // This rank's part of one bucket.
  struct Part {
    int64_t begin = 0;        // its first element in the bucket
    at::Tensor weights;       // this rank's part of the bucket's weights, updated in place
    at::Tensor gradients;     // the average of the part's gradients, when update() reads it
    at::Tensor exp_avg = {};  // AdamW's moments of the part, made by PartsAdamW
    at::Tensor exp_avg_sq = {};
  };

  // `buckets` lays out `parameters` (members index them); `parts` gives this rank's weights and
  // gradients of each bucket, in the same order; the moments start at zero.
  PartsAdamW(const NamedParameters& parameters, std::vector<BucketLayout> buckets,
             std::vector<Part> parts, Communicator& communicator, AdamWOptions options);

  void step(double lr, const at::Tensor& skip) { update_.step(lr, skip); }

  // The state as one rank would hold it: each bucket's moments all-gathered on the device, one
  // bucket at a time, and kept on the CPU by rank 0 only. A collective.
  OptimizerState state() const;
  // This rank's pieces of state(), as a checkpoint writes them (Optimizer::state_share).
  SafetensorsShare state_share() const { return share(/*writing=*/true); }
  // Reads this rank's parts of the state from a checkpoint (Optimizer::load_own_state).
  void load_own_state(const SafetensorsReader& file, const std::string& source);
  // Each rank takes its part of the whole state; nothing changes unless every entry is there.
  void load_state(const OptimizerState& saved, const std::string& source);
  int64_t state_bytes() const;

  const std::vector<Part>& parts() const { return parts_; }
  const NamedParameters& parameters() const { return named_; }

 private:
  const NamedParameter& member(size_t bucket, size_t k) const {
    return named_[buckets_[bucket].members[k]];
  }
  void add_pieces_to_update(const BucketLayout& bucket, const Part& part);
  // The entries of the whole state and the pieces of it that are this rank's: views into its
  // moments and step count. `writing`: only those it writes into a checkpoint (the first
  // replica's parts, and the step counts on rank 0); else all it holds.
  SafetensorsShare share(bool writing) const;

  NamedParameters named_;
  std::vector<BucketLayout> buckets_;
  std::vector<Part> parts_;
  Communicator& communicator_;
  AdamWUpdate update_;
  std::vector<at::Tensor> decayed_grads_;  // the pieces' gradients, in the order of add()
  std::vector<at::Tensor> other_grads_;
};

// Whether this rank writes its parts into a checkpoint: every rank does but those of the replicas
// after the first (hybrid sharding), which hold the same parts again.
inline bool writes_its_parts(const Communicator& communicator) {
  return communicator.run_rank() == communicator.rank();
}

// The pieces of the named tensors "<part name><suffix>" of `parameters` (hf_parameters) that
// `values` holds: this rank's part, from element `begin`, of a flat bucket that `bucket` lays out.
std::vector<TensorPiece> pieces_of_part(const NamedParameters& parameters,
                                        const BucketLayout& bucket, int64_t begin,
                                        const at::Tensor& values, std::string_view suffix);

// The entries "<part name><suffix>" of `parameter`'s parts, in their shapes, of `dtype`.
void add_part_entries(std::vector<SafetensorsEntry>& entries, const NamedParameter& parameter,
                      std::string_view suffix, at::ScalarType dtype);

}  // namespace mltrain
