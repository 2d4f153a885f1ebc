#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/layers/linear.h"
#include "model/layers/lora_config.h"

namespace mltrain {

// LoRA's adapters on one projection W [rows, columns], for the targets it holds (a fused one holds
// several: q, k and v are rows of wqkv, gate and up rows of w_gate_up): for each, A [rank,
// columns] and B [the target's rows, rank], registered as "<target>_A" and "<target>_B", and the
// target's rows of the output add scale · B A x. The model draws A (uniform within
// 1 / sqrt(columns), as PEFT's) and zeros B, so that an adapted model computes what its base does
// until it trains.
class LowRankAdapterImpl : public torch::nn::Module {
 public:
  struct Target {
    std::string name;  // as lora.targets names it
    int64_t first_row = 0;
    int64_t rows = 0;
  };

  LowRankAdapterImpl(int64_t rows, int64_t columns, std::vector<Target> targets,
                     const LoraConfig& lora, const WeightOptions& options);

  // `projected` (x Wᵀ, [.., rows]) with each target's product added to its rows.
  at::Tensor add_to(const at::Tensor& x, const at::Tensor& projected) const;
  // W's rows of each target += scale · B A: the weight that computes what W and the adapters do.
  void merge_into(const at::Tensor& weight) const;

 private:
  int64_t rows_;
  std::vector<Target> targets_;
  std::vector<at::Tensor> a_;
  std::vector<at::Tensor> b_;
  double scale_;
};
TORCH_MODULE(LowRankAdapter);

// `projected` with `adapter`'s products added, or as it is without one.
inline at::Tensor adapted(const LowRankAdapter& adapter, const at::Tensor& x,
                          const at::Tensor& projected) {
  return adapter ? adapter->add_to(x, projected) : projected;
}

// The adapter of a projection whose rows hold `parts` (target names and rows, in order), for
// those of them that `lora` targets; none where it targets none or LoRA is off.
LowRankAdapter adapter_for(int64_t columns,
                           const std::vector<std::pair<std::string, int64_t>>& parts,
                           const LoraConfig& lora, const WeightOptions& options);

}  // namespace mltrain
