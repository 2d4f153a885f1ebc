#pragma once

#include <torch/nn/modules/linear.h>

#include <cstdint>

namespace mltrain {

// The options of every projection in the model: in -> out features, no bias (LLaMA has none).
inline torch::nn::LinearOptions bias_free_linear(int64_t in, int64_t out) {
  return torch::nn::LinearOptions(in, out).bias(false);
}

}  // namespace mltrain
