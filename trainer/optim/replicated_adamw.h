#pragma once

#include "trainer/optim/adamw.h"
#include "trainer/optim/optimizer.h"
#include "trainer/optim/replicated_gradients.h"

namespace mltrain {

// Plain data parallelism, as DDP: every rank holds the whole AdamW state and takes the same
// update, from gradients that the reducer all-reduces while backward runs.
class ReplicatedAdamW : public Optimizer {
 public:
  ReplicatedAdamW(const NamedParameters& parameters, Communicator& communicator,
                  const DataParallelOptions& options);

  void set_sync(bool last_micro_step) override { gradients_.set_sync(last_micro_step); }
  ReducedGradients reduce_gradients() override { return gradients_.reduce(); }
  void update(double lr, const at::Tensor& skip) override;
  OptimizerState state() const override { return adamw_.state(); }
  void load_state(const OptimizerState& saved, const std::string& source) override {
    adamw_.load_state(saved, source);
  }
  int64_t state_bytes() const override { return adamw_.state_bytes(); }

 private:
  ReplicatedGradients gradients_;
  AdamW adamw_;
};

}  // namespace mltrain
