#pragma once

#include "dist/grad_reducer.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/optimizer.h"

namespace mltrain {

// Plain data parallelism, as DDP: every rank holds the whole AdamW state and takes the same
// update, from gradients that the reducer all-reduces while backward runs.
class ReplicatedAdamW : public Optimizer {
 public:
  ReplicatedAdamW(const NamedParameters& parameters, Communicator& communicator,
                  const DataParallelOptions& options);

  void set_sync(bool last_micro_step) override { reducer_.set_sync(last_micro_step); }
  ReducedGradients reduce_gradients() override;
  void update(double lr, const at::Tensor& skip) override;
  OptimizerState state() const override { return adamw_.state(); }
  void load_state(const OptimizerState& saved, const std::string& source) override {
    adamw_.load_state(saved, source);
  }
  int64_t state_bytes() const override { return adamw_.state_bytes(); }

 private:
  std::vector<at::Tensor> parameters_;
  GradReducer reducer_;
  AdamW adamw_;
  bool reduced_ = false;  // reduce_gradients() ran since the last update()
};

}  // namespace mltrain
