#pragma once

#include "trainer/config/config.h"

namespace mltrain {

// The process-wide compute settings of train.*, applied before a model runs: the CPU's intra-op
// thread count (train.threads) and denormal flushing. (The model's kernels are no such setting: the
// model is built with them, model/kernels.h.)
//
// Denormals are flushed to zero on the CPU (FTZ and DAZ), always: a gradient or moment that
// decays into the denormal range makes every multiply on it take a slow microcode path, and a
// CPU step was seen to slow threefold that way. Values below 1.2e-38 carry nothing a training
// step needs. Flushing is a per-thread CPU flag, which threads inherit when they are created, so
// it is set on the calling thread and on every thread of ATen's intra-op pool.
void apply_compute_settings(const TrainConfig& train);

// Whether this thread flushes denormals (for the log and the tests).
bool flushes_denormals();

}  // namespace mltrain
