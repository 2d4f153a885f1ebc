#include "model/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "model/layers/kv_cache.h"
#include "tests/model/tiny_config.h"

namespace mltrain {
namespace {

using testing::tiny_config;
using Tokens = std::vector<int64_t>;

class Generate : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(21);
    model = Llama(tiny_config(), Kernels::fused_cpu);
    model->eval();
  }

  static Tokens random_prompt(int64_t length) {
    const at::Tensor ids = at::randint(tiny_config().vocab_size, {length}, at::kLong);
    return Tokens(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + length);
  }

  Tokens alone(const Tokens& prompt, const GenerationOptions& options) {
    return generate(model, {prompt}, options).tokens.at(0);
  }

  Llama model{nullptr};
};

GenerationOptions greedy(int64_t max_new_tokens) {
  GenerationOptions options;
  options.sampling.temperature = 0.0;
  options.max_new_tokens = max_new_tokens;
  return options;
}

GenerationOptions sampled(int64_t max_new_tokens, uint64_t seed) {
  GenerationOptions options;
  options.sampling.temperature = 1.0;  // a random model's logits are flat: many tokens compete
  options.sampling.top_k = 0;
  options.sampling.top_p = 1.0;
  options.seed = seed;
  options.max_new_tokens = max_new_tokens;
  return options;
}

// The same decoding without a cache: the whole sequence is recomputed for every new token.
Tokens recomputed(Llama& model, const Tokens& prompt, const GenerationOptions& options) {
  at::NoGradGuard no_grad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  Tokens sequence = prompt;
  Tokens generated;
  while (static_cast<int64_t>(generated.size()) < options.max_new_tokens) {
    const at::Tensor logits = model(at::tensor(sequence, at::kLong).unsqueeze(0));
    generated.push_back(choose_token(logits[0][-1], options.sampling, generator));
    sequence.push_back(generated.back());
  }
  return generated;
}

TEST_F(Generate, CachedDecodingGivesTheTokensOfRecomputingTheSequence) {
  const Tokens prompt = random_prompt(7);
  for (const GenerationOptions& options : {greedy(30), sampled(30, 5)}) {
    const Tokens cached = alone(prompt, options);
    EXPECT_EQ(cached.size(), 30u);
    EXPECT_EQ(cached, recomputed(model, prompt, options));
  }
}

TEST_F(Generate, StopsAtTheStopTokenAndAtTheLimits) {
  const Tokens prompt = random_prompt(5);
  const Tokens free_run = alone(prompt, greedy(12));
  ASSERT_EQ(free_run.size(), 12u);
  GenerationOptions stopping = greedy(12);
  stopping.stop = free_run[4];
  const Tokens stopped = alone(prompt, stopping);
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[4]);
  EXPECT_EQ(stopped, Tokens(free_run.begin(), first + 1)) << "ends with the stop token";
  // 60 of max_seq_len 64 positions taken: 4 more are fed, and the token after them is predicted.
  EXPECT_EQ(alone(random_prompt(60), greedy(12)).size(), 5u);
  EXPECT_EQ(alone(random_prompt(64), greedy(12)).size(), 1u);
  EXPECT_THROW(alone(random_prompt(65), greedy(12)), UserError);
}

TEST_F(Generate, ASeedReproducesItsTokensAndAnotherSeedDiffers) {
  const Tokens prompt = random_prompt(4);
  EXPECT_EQ(alone(prompt, sampled(20, 1)), alone(prompt, sampled(20, 1)));
  EXPECT_NE(alone(prompt, sampled(20, 1)), alone(prompt, sampled(20, 2)));
  EXPECT_EQ(alone(prompt, greedy(20)), alone(prompt, greedy(20)));
}

// A model may have ids its tokenizer cannot spell; sampling over a flat distribution would pick
// some of them in 200 draws if they were allowed.
TEST_F(Generate, ChoosesOnlyIdsBelowTheVocabularyLimit) {
  GenerationOptions options = sampled(200, 5);
  options.vocab_limit = 4;
  const Tokens tokens = alone(random_prompt(3), options);
  ASSERT_EQ(tokens.size(), 62u);  // max_seq_len 64 ends it
  for (const int64_t token : tokens) EXPECT_LT(token, 4);
  options.vocab_limit = 0;
  const Tokens unlimited = alone(random_prompt(3), options);
  EXPECT_TRUE(std::any_of(unlimited.begin(), unlimited.end(), [](int64_t t) { return t >= 4; }));
}

TEST_F(Generate, PaddedBatchGivesEachRowTheLogitsItHasAlone) {
  at::NoGradGuard no_grad;
  const std::vector<Tokens> prompts = {random_prompt(3), random_prompt(8), random_prompt(5)};
  const Tokens next = random_prompt(3);  // one token fed back per row
  at::Tensor batch = at::zeros({3, 8}, at::kLong);
  for (int64_t b = 0; b < 3; ++b) {
    const auto length = static_cast<int64_t>(prompts[b].size());
    batch[b].narrow(0, 8 - length, length).copy_(at::tensor(prompts[b], at::kLong));
  }
  KVCache cache(tiny_config(), {5, 0, 3}, 9, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor prefill = model(batch, 0, &cache);
  const at::Tensor step = model(at::tensor(next, at::kLong).unsqueeze(1), 8, &cache);
  for (int64_t b = 0; b < 3; ++b) {
    Tokens sequence = prompts[b];
    sequence.push_back(next[b]);
    const at::Tensor expected = model(at::tensor(sequence, at::kLong).unsqueeze(0))[0];
    const auto length = static_cast<int64_t>(prompts[b].size());
    EXPECT_LE((prefill[b].narrow(0, 8 - length, length) - expected.narrow(0, 0, length))
                  .abs()
                  .max()
                  .item<double>(),
              1e-5)
        << "row " << b;
    EXPECT_LE((step[b][0] - expected[length]).abs().max().item<double>(), 1e-5) << "row " << b;
  }
}

TEST_F(Generate, BatchedPromptsOfDifferentLengthsGiveTheTokensOfOneAtATime) {
  // Lengths that pad each other, and one so long that max_seq_len ends it while the others go on:
  // rows leave the batch as they finish.
  const std::vector<Tokens> prompts = {random_prompt(3), random_prompt(9), random_prompt(1),
                                       random_prompt(6), random_prompt(58)};
  for (GenerationOptions options : {greedy(16), sampled(16, 11)}) {
    std::vector<Tokens> expected;
    for (const Tokens& prompt : prompts) expected.push_back(alone(prompt, options));
    EXPECT_EQ(generate(model, prompts, options).tokens, expected);
    EXPECT_EQ(expected[4].size(), 7u);
    // A stop token one row makes early drops that row mid-batch.
    options.stop = expected[1][2];
    expected.clear();
    for (const Tokens& prompt : prompts) expected.push_back(alone(prompt, options));
    EXPECT_EQ(generate(model, prompts, options).tokens, expected);
  }
}

TEST_F(Generate, ReportsEachTokenAsItIsChosen) {
  const std::vector<Tokens> prompts = {random_prompt(2), random_prompt(5)};
  std::vector<Tokens> seen(2);
  const Generation generation =
      generate(model, prompts, sampled(6, 3),
               [&](size_t prompt, int64_t token) { seen.at(prompt).push_back(token); });
  EXPECT_EQ(seen, generation.tokens);
  EXPECT_GT(generation.prefill_seconds, 0.0);
  EXPECT_GT(generation.decode_seconds, 0.0);
}

}  // namespace
}  // namespace mltrain
