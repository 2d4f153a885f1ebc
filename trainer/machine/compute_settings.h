#pragma once

#include "trainer/config/config.h"

namespace mltrain {

// The process-wide compute settings of train.*, applied before a model runs: the CPU's intra-op
// thread count (train.threads), denormal flushing, and TF32 for CUDA's fp32 matrix products
// (train.tf32; on by default: several times the fp32 rate for a 10-bit mantissa in the products'
// inputs, which training tolerates; PyTorch's default is off, so a like-for-like fp32 comparison
// sets it false). (The model's kernels are no such
// setting: the model is built with them, model/kernels/kernels.h.)
//
// Denormals are flushed to zero on the CPU (FTZ and DAZ), always: a gradient or moment that
// decays into the denormal range makes every multiply on it take a slow microcode path, and a
// CPU step was seen to slow threefold that way. Values below 1.2e-38 carry nothing a training
// step needs. Flushing is a per-thread CPU flag, which threads inherit when they are created, so
// it is set on the calling thread and on every thread of ATen's intra-op pool.
void apply_compute_settings(const TrainConfig& train);

// Whether this thread flushes denormals (for the log and the tests).
bool flushes_denormals();

// Whether CUDA's fp32 matrix products run in TF32 (for the log and the tests).
bool cuda_matmuls_in_tf32();

}  // namespace mltrain
