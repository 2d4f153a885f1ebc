#include "model/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>

#include "model/layers/kv_cache.h"

namespace mltrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The prompts as one batch [B, width], each right-aligned so that all end at slot width - 1.
// Token 0 pads: any id would do, the cache's mask hides it.
at::Tensor left_padded(const std::vector<std::vector<int64_t>>& prompts, int64_t width) {
  at::Tensor batch = at::zeros({static_cast<int64_t>(prompts.size()), width}, at::kLong);
  auto rows = batch.accessor<int64_t, 2>();
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto start = width - static_cast<int64_t>(prompts[b].size());
    for (size_t i = 0; i < prompts[b].size(); ++i) rows[b][start + i] = prompts[b][i];
  }
  return batch;
}

// The logits of each row's last token over ids [0, vocab_limit), as fp32 on the CPU, where tokens
// are chosen. Only the last position goes through the output projection: the prefill of a long
// batch would otherwise make [B, T, V] logits to keep one row of each.
at::Tensor last_logits(Llama& model, const at::Tensor& tokens, int64_t start, KVCache& cache,
                       int64_t vocab_limit) {
  const at::Tensor& weight = model->output_weight();
  const at::Tensor last =
      model->hidden_states(tokens.to(weight.device()), start, &cache).select(1, -1);
  const at::Tensor chosen_from = vocab_limit > 0 ? weight.narrow(0, 0, vocab_limit) : weight;
  return at::linear(last, chosen_from).to(at::kCPU, at::kFloat);
}

}  // namespace

Generation generate(Llama& model, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerationOptions& options, const TokenCallback& on_token) {
  TORCH_CHECK(options.max_new_tokens > 0, "max_new_tokens must be positive");
  TORCH_CHECK(options.vocab_limit <= model->config().vocab_size, "vocab_limit ",
              options.vocab_limit, " exceeds the model's vocab_size");
  Generation result;
  result.tokens.resize(prompts.size());
  if (prompts.empty()) return result;
  at::NoGradGuard no_grad;
  const ModelConfig& config = model->config();

  int64_t width = 0;
  for (const std::vector<int64_t>& prompt : prompts) {
    TORCH_CHECK(!prompt.empty(), "a prompt needs at least one token");
    width = std::max(width, static_cast<int64_t>(prompt.size()));
  }
  std::vector<int64_t> row_starts;
  std::vector<size_t> budgets;  // new tokens each prompt may get
  int64_t steps = 1;
  for (const std::vector<int64_t>& prompt : prompts) {
    const auto length = static_cast<int64_t>(prompt.size());
    row_starts.push_back(width - length);
    const int64_t budget =
        std::max<int64_t>(1, std::min(options.max_new_tokens, config.max_seq_len - length + 1));
    budgets.push_back(static_cast<size_t>(budget));
    steps = std::max(steps, budget);
  }
  // Every token but each prompt's last new one is fed back, one slot each.
  KVCache cache(config, row_starts, width + steps - 1, model->output_weight().options());
  std::vector<at::Generator> generators;
  for (size_t i = 0; i < prompts.size(); ++i)
    generators.push_back(at::make_generator<at::CPUGeneratorImpl>(options.seed));

  Clock::time_point start = Clock::now();
  at::Tensor logits =
      last_logits(model, left_padded(prompts, width), 0, cache, options.vocab_limit);
  result.prefill_seconds = seconds_since(start);

  start = Clock::now();
  std::vector<size_t> active(prompts.size());  // the prompt of each row of the cache
  for (size_t row = 0; row < active.size(); ++row) active[row] = row;
  for (int64_t slot = width;; ++slot) {
    std::vector<int64_t> continuing_rows;
    std::vector<int64_t> fed_back;
    for (size_t row = 0; row < active.size(); ++row) {
      const size_t prompt = active[row];
      const int64_t token =
          choose_token(logits[static_cast<int64_t>(row)], options.sampling, generators[prompt]);
      result.tokens[prompt].push_back(token);
      if (on_token) on_token(prompt, token);
      const bool stopped = options.stop && token == *options.stop;
      if (!stopped && result.tokens[prompt].size() < budgets[prompt]) {
        continuing_rows.push_back(static_cast<int64_t>(row));
        fed_back.push_back(token);
      }
    }
    if (continuing_rows.empty()) break;
    if (continuing_rows.size() < active.size()) {
      cache.keep_rows(continuing_rows);
      std::vector<size_t> continuing;
      for (const int64_t row : continuing_rows) continuing.push_back(active[row]);
      active = std::move(continuing);
    }
    logits = last_logits(model, at::tensor(fed_back, at::kLong).unsqueeze(1), slot, cache,
                         options.vocab_limit);
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace mltrain
