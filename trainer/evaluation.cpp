#include "trainer/evaluation.h"

#include <ATen/ATen.h>

#include <cmath>

#include "data/loader.h"
#include "trainer/precision.h"

namespace mltrain {

Evaluation evaluate(Llama& model, const TokenWindows& windows, const BatchLayout& layout, int64_t eval_batches,
                    c10::Device device, bool bf16, Communicator& communicator) {
  at::NoGradGuard no_grad;
  model->eval();
  double loss_sum = 0.0;
  int64_t tokens = 0;
  const int64_t batches = validation_batches(windows.num_windows(), layout, eval_batches);
  for (int64_t batch = 0; batch < batches; ++batch) {
    const std::vector<int64_t> indices = validation_windows(windows.num_windows(), layout, batch, communicator.rank());
    if (indices.empty()) continue;
    const at::Tensor window = gather_windows(windows, indices).to(device);
    const int64_t length = window.size(1) - 1;
    at::Tensor loss;
    {
      AutocastGuard autocast(device, bf16);
      loss = next_token_loss(model(window.narrow(1, 0, length)), window.narrow(1, 1, length));
    }
    const int64_t batch_tokens = window.size(0) * length;
    loss_sum += loss.item<double>() * static_cast<double>(batch_tokens);
    tokens += batch_tokens;
  }
  model->train();
  const double all_tokens = communicator.all_reduce_sum(static_cast<double>(tokens));
  const double loss = communicator.all_reduce_sum(loss_sum) / all_tokens;
  return {loss, std::exp(loss), static_cast<int64_t>(all_tokens)};
}

}  // namespace mltrain
