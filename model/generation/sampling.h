#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>

#include <cstdint>

namespace mltrain {

// How the next token is chosen from the model's logits. The defaults are mlgen's: a small model
// decoded greedily soon repeats itself, while sampling at a slightly lowered temperature from the
// most likely tokens writes text in the corpus's style.
struct SamplingOptions {
  double temperature = 0.8;  // 0: greedy (the most likely token, no randomness)
  int64_t top_k = 50;        // keep the k most likely tokens; 0: all
  double top_p = 0.95;       // then keep the smallest set of them whose mass reaches p; 1: all

  bool greedy() const { return temperature == 0.0; }
};

// The distribution a token is drawn from, as fp32 probabilities [V] on the CPU: softmax of
// logits [V] / temperature, restricted to the top_k most likely tokens, then to the smallest
// most-likely-first prefix of those whose mass is at least top_p, renormalised after each step.
// Needs a positive temperature, and any positive one gives that distribution, computed without
// overflow: a temperature so small that every other token's probability underflows gives the
// argmax alone (greedy), and a huge one every token alike.
at::Tensor sampling_distribution(const at::Tensor& logits, const SamplingOptions& options);

// A token drawn from probabilities [V] (fp32, CPU) by inverting their cumulative sum at one
// uniform number of `generator`: the same generator state always gives the same token.
int64_t draw_token(const at::Tensor& probabilities, at::Generator& generator);

// The next token for logits [V]: their argmax when greedy (the generator untouched), else a draw
// from sampling_distribution.
int64_t choose_token(const at::Tensor& logits, const SamplingOptions& options,
                     at::Generator& generator);

}  // namespace mltrain
