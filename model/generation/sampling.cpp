#include "model/generation/sampling.h"

#include <ATen/ATen.h>

namespace mltrain {
namespace {

// The probabilities of `indices` alone, renormalised; every other token gets 0.
at::Tensor keep_only(const at::Tensor& probabilities, const at::Tensor& indices) {
  at::Tensor kept = at::zeros_like(probabilities);
  kept.index_copy_(0, indices, probabilities.index_select(0, indices));
  return kept / kept.sum();
}

}  // namespace

at::Tensor sampling_distribution(const at::Tensor& logits, const SamplingOptions& options) {
  TORCH_CHECK(options.temperature > 0.0, "sampling needs a positive temperature, got ",
              options.temperature);
  // Each logit's distance below the largest, divided by the temperature, in double: the logits
  // themselves divided by a small temperature overflow fp32 (at 1e-38, to inf, and inf - inf is
  // NaN in the softmax), and a temperature below fp32's smallest is 0 there. A distance of at most
  // 0 divided by any positive double is at worst -inf, whose exp is 0: where the distances to the
  // largest underflow exp, the distribution is the argmax's alone (ties share it), which is greedy.
  const at::Tensor scaled = logits.to(at::kCPU, at::kDouble);
  at::Tensor probabilities =
      ((scaled - scaled.max()) / options.temperature).softmax(-1).to(at::kFloat);
  const int64_t vocab = probabilities.size(0);
  if (options.top_k > 0 && options.top_k < vocab) {
    probabilities = keep_only(probabilities, std::get<1>(probabilities.topk(options.top_k)));
  }
  if (options.top_p < 1.0) {
    const auto [sorted, order] = probabilities.sort(/*stable=*/true, /*dim=*/0,
                                                    /*descending=*/true);
    // A token stays while the tokens more likely than it hold less than top_p: the first token
    // always does, and the last one kept is the one whose mass makes the set reach top_p.
    const at::Tensor mass_before = sorted.to(at::kDouble).cumsum(0) - sorted.to(at::kDouble);
    probabilities = keep_only(probabilities, order.masked_select(mass_before < options.top_p));
  }
  return probabilities;
}

int64_t draw_token(const at::Tensor& probabilities, at::Generator& generator) {
  const at::Tensor p = probabilities.to(at::kCPU, at::kFloat).contiguous();
  const float* data = p.const_data_ptr<float>();
  const int64_t vocab = p.numel();
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += data[i];
  // Scaled by the total, so that probabilities summing to 1 only up to rounding lose no token.
  const double target =
      at::rand({1}, generator, at::TensorOptions().dtype(at::kDouble)).item<double>() * total;
  double cumulative = 0.0;
  int64_t last_possible = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (data[i] <= 0.0f) continue;
    cumulative += data[i];
    last_possible = i;
    if (target < cumulative) return i;
  }
  return last_possible;
}

int64_t choose_token(const at::Tensor& logits, const SamplingOptions& options,
                     at::Generator& generator) {
  if (options.greedy()) return logits.argmax().item<int64_t>();
  return draw_token(sampling_distribution(logits, options), generator);
}

}  // namespace mltrain
