#pragma once

#include <c10/core/Device.h>

#include "data/sampler.h"
#include "data/token_windows.h"
#include "dist/communicator.h"
#include "model/llama.h"

namespace mltrain {

struct Evaluation {
  double loss;        // mean next-token cross-entropy over every evaluated target, on all ranks
  double perplexity;  // exp(loss)
  int64_t tokens;
};

// Evaluates the model on the first `eval_batches` validation batches (0: all) in file order, the
// same windows on every run; each rank takes its slice and the sums are combined over the ranks.
// Gradients are off; bf16 autocast follows `bf16`.
Evaluation evaluate(Llama& model, const TokenWindows& windows, const BatchLayout& layout, int64_t eval_batches,
                    c10::Device device, bool bf16, Communicator& communicator);

}  // namespace mltrain
