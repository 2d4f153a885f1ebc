#include "trainer/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mltrain {

double learning_rate(const OptimConfig& optim, int64_t max_steps, int64_t step) {
  if (step <= optim.warmup_steps) {
    return optim.lr * static_cast<double>(step) / static_cast<double>(optim.warmup_steps);
  }
  const int64_t done = step - 1;  // steps before this one
  const double decay_steps =
      static_cast<double>(std::max<int64_t>(1, max_steps - optim.warmup_steps));
  const double progress = std::clamp((done - optim.warmup_steps) / decay_steps, 0.0, 1.0);
  if (optim.schedule == "cosine") {
    return optim.min_lr +
           (optim.lr - optim.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  if (optim.schedule == "linear") return optim.lr + (optim.min_lr - optim.lr) * progress;
  if (optim.schedule == "wsd") {
    const double decay_start = static_cast<double>(max_steps) * (1.0 - optim.decay_fraction);
    const double decay_length = static_cast<double>(max_steps) - decay_start;
    if (done < decay_start || decay_length <= 0.0) return optim.lr;
    return optim.lr +
           (optim.min_lr - optim.lr) * std::min(1.0, (done - decay_start) / decay_length);
  }
  return optim.lr;  // constant
}

}  // namespace mltrain
