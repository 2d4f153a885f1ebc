#include "trainer/machine/compute_settings.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <limits>

namespace mltrain {

void apply_compute_settings(const TrainConfig& train) {
  if (train.threads > 0) at::set_num_threads(static_cast<int>(train.threads));
  at::globalContext().setFlushDenormal(true);
  // One task per pool thread: ATen splits [0, n) into n chunks of one, and its OpenMP pool gives
  // each thread one, so every worker sets its own flag (threads created later inherit it). A
  // worker without it would produce denormals where the others produce zeros; the flush test
  // checks a product spread over the threads.
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1,
                   [](int64_t, int64_t) { at::globalContext().setFlushDenormal(true); });
  // The setter that sets both of torch's flags, the legacy one and the one of 2.9 on: ATen reads
  // either, and throws ("a mix of the legacy and new APIs") where they disagree.
  at::globalContext().setAllowTF32CuBLAS(train.tf32);
}

bool cuda_matmuls_in_tf32() {
  return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
         at::Float32Precision::TF32;
}

bool flushes_denormals() {
  volatile float smallest_normal = std::numeric_limits<float>::min();
  return smallest_normal / 2.0f == 0.0f;
}

}  // namespace mltrain
