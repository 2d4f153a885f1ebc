#pragma once

#include <string>
#include <vector>

#include "trainer/optim/adamw.h"
#include "trainer/optim/muon.h"
#include "trainer/optim/optimizer.h"
#include "trainer/optim/replicated_gradients.h"

namespace mltrain {

// Whether Muon updates `parameter` (under its Hugging Face name, as the optimizers know it): the
// matrices inside the blocks (the attention and feed-forward projections). The embedding (tied
// with the output layer), an untied output layer and the norms' gains stay on AdamW: Muon is
// defined for hidden matrices. Each part of a fused projection is a matrix of its own to Muon.
bool updated_by_muon(const NamedParameter& parameter);

// optim.name muon: Muon (muon.h) for the blocks' matrices and AdamW for the rest, on the ranks of
// a communicator. The gradients are all-reduced while backward runs, as for replicated AdamW, so
// every rank holds the whole averaged gradient of every matrix, which Muon needs whole.
//
// With `options.zero1` (dist.zero_stage 1) the state of the matrices is sharded by parameter, as
// Muon's orthogonalisation needs each matrix whole: each parameter (a fused projection with all
// its matrices) has one owner rank, which alone keeps its momentum and takes its update, and then
// every parameter is broadcast from its owner. The parameters are dealt largest first, each to the
// rank that owns the fewest elements so far. AdamW's state of the rest (the embedding, the norms)
// stays whole on every rank.
//
// The state, as a checkpoint holds it whatever the ranks: AdamW's entries of its parameters
// (adamw.h), and "<part>.momentum" of each matrix.
class MuonOptimizer : public Optimizer {
 public:
  MuonOptimizer(const NamedParameters& parameters, Communicator& communicator,
                const DataParallelOptions& options);

  void set_sync(bool last_micro_step) override { gradients_.set_sync(last_micro_step); }
  ReducedGradients reduce_gradients() override { return gradients_.reduce(); }
  // Muon's learning rate is `lr` times options.muon_lr_ratio: the schedule scales both alike.
  void update(double lr, const at::Tensor& skip) override;
  OptimizerState state() const override;
  void load_state(const OptimizerState& saved, const std::string& source) override;
  int64_t state_bytes() const override;

 private:
  struct Matrix {
    NamedParameter parameter;  // one or several matrices stacked (its parts)
    int owner = 0;             // the rank that updates it
    at::Tensor momentum;       // on its owner only
  };
  bool owns(const Matrix& matrix) const { return matrix.owner == communicator_.rank(); }

  Communicator& communicator_;
  const bool sharded_;
  const double muon_lr_ratio_;
  ReplicatedGradients gradients_;
  std::vector<Matrix> matrices_;
  AdamW adamw_;           // of the parameters that are not Muon's
  MuonUpdate muon_;       // of the matrices this rank owns
  bool reduced_ = false;  // reduce_gradients() ran since the last update()
};

}  // namespace mltrain
