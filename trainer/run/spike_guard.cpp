#include "trainer/run/spike_guard.h"

#include <ATen/ATen.h>

namespace mltrain {
namespace {

// How much of the level each applied step's loss replaces: it follows about the last ten.
constexpr double kLevelWeight = 0.1;
// A level below this counts as this: near a loss of 0 (a memorised batch) a tiny loss is many
// times a tinier level from noise alone, and no harm to the weights.
constexpr double kLowestLevel = 0.1;

}  // namespace

SpikeGuard::SpikeGuard(double factor, double level, c10::Device device)
    : factor_(factor), level_(at::full({}, level, at::TensorOptions(at::kDouble).device(device))) {}

at::Tensor SpikeGuard::is_spike(const at::Tensor& loss) const {
  if (factor_ == 0.0) return at::zeros({}, at::TensorOptions(at::kBool).device(loss.device()));
  return (level_ > 0) & (loss > at::clamp_min(level_, kLowestLevel) * factor_);
}

void SpikeGuard::follow(const at::Tensor& loss, const at::Tensor& skipped) {
  const at::Tensor followed =
      at::where(level_ > 0, level_ * (1.0 - kLevelWeight) + loss * kLevelWeight, loss);
  level_.copy_(at::where(skipped != 0, level_, followed));
}

double SpikeGuard::level() const { return level_.item<double>(); }

}  // namespace mltrain
