#pragma once

#include <cstdint>

#include "trainer/config/config.h"

namespace mltrain {

// The learning rate of optimizer step `step` (counted from 1): linear warmup from lr / warmup_steps
// to lr over the first warmup_steps steps, then, until max_steps, one of
//   cosine:   min_lr + (lr - min_lr) (1 + cos(pi p)) / 2, p the fraction of the decay done before
//             this step
//   linear:   lr + (min_lr - lr) p
//   constant: lr
//   wsd:      lr, then linear to min_lr over the last optim.decay_fraction of all steps
double learning_rate(const OptimConfig& optim, int64_t max_steps, int64_t step);

}  // namespace mltrain
