// LoRA's adapters on the model (model/layers/lora.h): what the base computes at step 0, gradients
// for the adapters alone, the targets' rows of the fused projections, and merging.
#include "model/layers/lora.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "model/interop/hf_state_dict.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

LoraConfig lora_of(const std::string& targets, int64_t rank = 4) {
  LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 8.0;
  lora.targets = targets;
  return lora;
}

Llama adapted_model(const LoraConfig& lora, Kernels kernels = Kernels::fused_cpu) {
  at::manual_seed(21);
  return Llama(testing::tiny_config(), kernels, LlamaImpl::Weights::drawn, at::kCPU, lora);
}

// Each adapter's B given values, so that the adapters change what the model computes.
void perturb_adapters(Llama& model) {
  at::NoGradGuard no_grad;
  at::manual_seed(22);
  for (const auto& item : model->named_parameters())
    if (item.key().ends_with("_B")) item.value().normal_(0.0, 0.05);
}

// B starts at zero: with adapters on every projection the model computes, bit for bit, what the
// same seed's model without adapters does, whose weights it shares.
TEST(Lora, AtStepZeroTheModelComputesWhatItsBaseDoes) {
  for (const Kernels kernels : {Kernels::fused_cpu, Kernels::aten}) {
    at::manual_seed(21);
    Llama base(testing::tiny_config(), kernels);
    Llama adapted = adapted_model(lora_of("q,k,v,o,gate,up,down"), kernels);
    const NamedTensors base_weights = hf_state_dict(base);
    const NamedTensors adapted_weights = hf_state_dict(adapted);
    EXPECT_GT(adapted_weights.size(), base_weights.size());
    for (const auto& [name, tensor] : base_weights)
      EXPECT_TRUE(at::equal(adapted_weights.at(name), tensor)) << name;
    at::manual_seed(23);
    const at::Tensor tokens = at::randint(testing::tiny_config().vocab_size, {2, 12});
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(adapted(tokens), base(tokens)));
  }
}

// The base weights are frozen: after backward only the adapters have gradients (B's nonzero; A's
// zero while B is, as the product's rule gives).
TEST(Lora, OnlyTheAdaptersGetGradients) {
  Llama model = adapted_model(lora_of("q,v,down"));
  const at::Tensor tokens = at::randint(testing::tiny_config().vocab_size, {2, 13});
  model->loss(tokens.narrow(1, 0, 12), tokens.narrow(1, 1, 12)).backward();
  int adapters = 0;
  for (const auto& item : model->named_parameters()) {
    const bool adapter = item.key().find("_lora.") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
    if (!adapter) {
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
      continue;
    }
    ++adapters;
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const double norm = item.value().grad().norm().item<double>();
    if (item.key().ends_with("_B")) {
      EXPECT_GT(norm, 0.0) << item.key();
    } else {
      EXPECT_EQ(norm, 0.0) << item.key();
    }
  }
  // q and v of wqkv, and down: an A and a B each, in each of 2 blocks.
  EXPECT_EQ(adapters, 2 * 2 * 3);
}

// A target adds to its own rows of a fused projection only: k's adapter changes the k rows of
// wqkv's output and no other. The parameter count is LoraConfig::parameters'.
TEST(Lora, AnAdapterAddsToItsTargetsRowsOfAFusedProjection) {
  const ModelConfig config = testing::tiny_config();
  Llama model = adapted_model(lora_of("k,up"));
  perturb_adapters(model);
  const LowRankAdapter& adapter = model->layers[0]->attn->wqkv_lora;
  ASSERT_TRUE(adapter);
  EXPECT_FALSE(model->layers[0]->attn->wo_lora);
  EXPECT_FALSE(model->layers[0]->ffn->w_down_lora);
  const int64_t q = config.n_q_heads * config.head_dim;
  const int64_t kv = config.n_kv_heads * config.head_dim;
  const at::Tensor x = at::randn({3, config.d_model});
  at::NoGradGuard no_grad;
  const at::Tensor delta = adapter->add_to(x, at::zeros({3, q + 2 * kv}));
  EXPECT_EQ(delta.narrow(1, 0, q).abs().max().item<double>(), 0.0);
  EXPECT_GT(delta.narrow(1, q, kv).abs().max().item<double>(), 0.0);
  EXPECT_EQ(delta.narrow(1, q + kv, kv).abs().max().item<double>(), 0.0);
  int64_t adapter_values = 0;
  for (const auto& item : model->named_parameters())
    if (item.key().find("_lora.") != std::string::npos) adapter_values += item.value().numel();
  EXPECT_EQ(adapter_values, lora_of("k,up").parameters(config));
  // By hand: k (64 columns, 32 rows) and up (64 columns, 96 rows), rank 4, in 2 blocks.
  EXPECT_EQ(adapter_values, 2 * 4 * ((64 + 32) + (64 + 96)));
}

// Merged into the weights they adapt, trained adapters compute what they did beside them, within
// fp32's rounding, and leave a plain model: no adapter among its parameters or Hugging Face names.
TEST(Lora, MergedAdaptersComputeWhatTheyDidBesideTheWeights) {
  Llama model = adapted_model(lora_of("q,k,v,o,gate,up,down"));
  perturb_adapters(model);
  at::manual_seed(24);
  const at::Tensor tokens = at::randint(testing::tiny_config().vocab_size, {2, 12});
  at::NoGradGuard no_grad;
  const at::Tensor unmerged = model(tokens);
  at::manual_seed(21);
  const at::Tensor base = Llama(testing::tiny_config(), Kernels::fused_cpu)(tokens);
  ASSERT_GT((unmerged - base).abs().max().item<double>(), 1e-3) << "the adapters change nothing";
  model->merge_adapters();
  EXPECT_FALSE(model->has_adapters());
  EXPECT_LE((model(tokens) - unmerged).abs().max().item<double>(), 1e-5);
  for (const auto& [name, tensor] : hf_state_dict(model))
    EXPECT_EQ(name.find("lora"), std::string::npos) << name;
  EXPECT_EQ(model->parameters().size(),
            Llama(testing::tiny_config(), Kernels::aten)->parameters().size());
}

// lora.targets names projections: anything else, or nothing, is refused by name.
TEST(Lora, TargetsThatAreNotProjectionsAreRefused) {
  try {
    lora_of("q,query").validate();
    ADD_FAILURE() << "an unknown target was taken";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "lora.targets: \"query\" is not a projection");
  }
  EXPECT_THROW(lora_of("").validate(), UserError);
  EXPECT_NO_THROW(lora_of(" q , v ").validate());
  EXPECT_EQ(lora_of("v,q,q").target_list(), (std::vector<std::string>{"q", "v"}));
  EXPECT_NO_THROW(lora_of("", 0).validate());  // off: no targets needed
}

}  // namespace
}  // namespace mltrain
