#include "model/generate.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "model/kv_cache.h"

namespace mltrain {

std::vector<int64_t> generate_greedy(Llama& model, const std::vector<int64_t>& prompt,
                                     int64_t max_new_tokens, std::optional<int64_t> stop) {
  at::NoGradGuard no_grad;
  const ModelConfig& config = model->config();
  const at::Tensor& weight = model->output_weight();
  const int64_t capacity =
      std::min<int64_t>(config.max_seq_len, static_cast<int64_t>(prompt.size()) + max_new_tokens);
  KVCache cache(config, /*batch=*/1, capacity, weight.options());

  std::vector<int64_t> generated;
  at::Tensor input = at::tensor(prompt, at::kLong).unsqueeze(0).to(weight.device());
  int64_t position = 0;
  while (static_cast<int64_t>(generated.size()) < max_new_tokens &&
         position + input.size(1) <= capacity) {
    const at::Tensor logits = model(input, position, &cache);
    position += input.size(1);
    const int64_t next = logits.select(1, -1).argmax(-1).item<int64_t>();
    generated.push_back(next);
    if (stop && next == *stop) break;
    input = at::full({1, 1}, next, input.options());
  }
  return generated;
}

}  // namespace mltrain
