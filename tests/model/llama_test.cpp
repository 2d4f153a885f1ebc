#include "model/layers/llama.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "model/kernels/autocast_region.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

// Parameters of a LLaMA decoder, counted from the architecture: embeddings, per layer the four
// attention projections, three SwiGLU matrices and two norms, the final norm, and an output
// projection unless it is tied.
int64_t count_by_formula(const ModelConfig& c) {
  const int64_t attention = c.d_model * c.head_dim * (2 * c.n_q_heads + 2 * c.n_kv_heads);
  const int64_t per_layer = attention + 3 * c.d_model * c.d_ffn + 2 * c.d_model;
  const int64_t output = c.tie_word_embeddings ? 0 : c.vocab_size * c.d_model;
  return c.vocab_size * c.d_model + c.n_layers * per_layer + c.d_model + output;
}

TEST(Llama, BaseModelHasTheChaptersParameterCount) {
  const ModelConfig base;
  Llama model(base, Kernels::fused_cpu);
  EXPECT_EQ(model->num_parameters(), 35'926'528);
  EXPECT_EQ(count_by_formula(base), 35'926'528);
}

TEST(Llama, TiedEmbeddingIsOneTensorListedOnce) {
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  EXPECT_EQ(model->output_weight().data_ptr(), model->token_embeddings->weight.data_ptr());
  std::set<const void*> storages;
  for (const at::Tensor& parameter : model->parameters()) {
    EXPECT_TRUE(storages.insert(parameter.data_ptr()).second) << "a tensor is listed twice";
  }
  EXPECT_EQ(model->parameters().size(), 1 + 6 * 2 + 1u);  // q, k, v fused; gate, up fused
  EXPECT_EQ(model->num_parameters(), count_by_formula(testing::tiny_config()));
}

TEST(Llama, UntiedModelHasItsOwnOutputProjection) {
  ModelConfig config = testing::tiny_config();
  config.tie_word_embeddings = false;
  Llama model(config, Kernels::fused_cpu);
  EXPECT_NE(model->output_weight().data_ptr(), model->token_embeddings->weight.data_ptr());
  EXPECT_EQ(model->num_parameters(), count_by_formula(config));
  EXPECT_EQ(count_by_formula(config) - count_by_formula(testing::tiny_config()), 97 * 64);
}

TEST(Llama, InitialisationFollowsTheStatedScheme) {
  at::manual_seed(5);
  Llama model(ModelConfig{},
              Kernels::fused_cpu);  // base shape: enough samples for tight statistics
  const double std = 0.02;
  const double residual = std / std::sqrt(2.0 * 12);
  const auto std_of = [](const at::Tensor& t) { return t.std().item<double>(); };
  EXPECT_NEAR(std_of(model->token_embeddings->weight), std, 0.02 * std);
  EXPECT_NEAR(std_of(model->layers[3]->attn->wqkv->weight), std, 0.02 * std);
  EXPECT_NEAR(std_of(model->layers[3]->ffn->w_gate_up->weight), std, 0.02 * std);
  EXPECT_NEAR(std_of(model->layers[3]->attn->wo->weight), residual, 0.02 * residual);
  EXPECT_NEAR(std_of(model->layers[11]->ffn->w_down->weight), residual, 0.02 * residual);
  EXPECT_NEAR(model->layers[0]->attn->wqkv->weight.mean().item<double>(), 0.0, 1e-3);
  EXPECT_TRUE(at::equal(model->layers[5]->ffn_norm->weight, at::ones({512})));
  EXPECT_TRUE(at::equal(model->norm->weight, at::ones({512})));
}

TEST(Llama, SameSeedSameWeights) {
  at::manual_seed(9);
  Llama first(testing::tiny_config(), Kernels::fused_cpu);
  at::manual_seed(9);
  Llama second(testing::tiny_config(), Kernels::fused_cpu);
  EXPECT_TRUE(
      at::equal(first->layers[1]->attn->wqkv->weight, second->layers[1]->attn->wqkv->weight));
}

// Each parameter is drawn from a generator of its own (the model's seed and its place): drawn
// alone, in another order, its values are those of the whole model's draw, as ZeRO-3 draws one
// unit at a time; and no two parameters of the same shape share values.
TEST(Llama, EachParameterDrawnAloneEqualsTheWholeModelsDraw) {
  ModelConfig config = testing::tiny_config();
  config.tie_word_embeddings = false;
  at::manual_seed(41);
  Llama whole(config, Kernels::fused_cpu);
  at::manual_seed(41);
  Llama in_pieces(config, Kernels::fused_cpu);
  const std::vector<at::Tensor> parameters = in_pieces->parameters();
  {
    at::NoGradGuard no_grad;
    for (const at::Tensor& parameter : parameters) parameter.zero_();
  }
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) in_pieces->initialize({*it});
  const std::vector<at::Tensor> expected = whole->parameters();
  for (size_t k = 0; k < parameters.size(); ++k)
    EXPECT_TRUE(at::equal(parameters[k], expected[k])) << "parameter " << k;
  EXPECT_FALSE(at::equal(whole->layers[0]->attn->wo->weight, whole->layers[1]->attn->wo->weight));
  EXPECT_FALSE(at::equal(whole->token_embeddings->weight, whole->lm_head->weight));
  at::manual_seed(42);
  Llama other_seed(config, Kernels::fused_cpu);
  EXPECT_FALSE(
      at::equal(other_seed->layers[0]->attn->wo->weight, whole->layers[0]->attn->wo->weight));
}

// Made without bytes, the model has every parameter's shape on the device given and holds
// nothing: ZeRO-3 gives each unit bytes in turn.
TEST(Llama, AModelMadeWithoutBytesHoldsNoneAndKeepsTheShapes) {
  const ModelConfig config = testing::tiny_config();
  Llama drawn(config, Kernels::fused_cpu);
  Llama empty(config, Kernels::fused_cpu, LlamaImpl::Weights::none, at::kCPU);
  const std::vector<at::Tensor> shapes = drawn->parameters();
  const std::vector<at::Tensor> parameters = empty->parameters();
  ASSERT_EQ(parameters.size(), shapes.size());
  for (size_t k = 0; k < parameters.size(); ++k) {
    EXPECT_EQ(parameters[k].sizes(), shapes[k].sizes());
    EXPECT_EQ(parameters[k].storage().nbytes(), 0u);
    EXPECT_TRUE(parameters[k].requires_grad());
  }
  EXPECT_EQ(empty->num_parameters(), drawn->num_parameters());
}

TEST(Llama, ForwardGivesLogitsPerPosition) {
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  const at::Tensor logits = model(at::zeros({3, 10}, at::kLong));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, 97}));
}

// A table gathered in bf16 (ZeRO-3 under bf16 autocast) trains as the same values kept in fp32:
// the embedding's gradient of a token read 256 times is their sum, not bf16's running sum of them
// (the CPU's embedding backward adds up in the table's dtype), and the rows enter the residual
// stream in fp32.
TEST(Llama, AnEmbeddingTableInBf16UnderAutocastGetsTheGradientOfFp32) {
  const at::Tensor tokens = at::zeros({8, 65}, at::kLong);
  tokens.narrow(0, 4, 4).fill_(3);
  std::vector<at::Tensor> gradients;
  for (const bool bf16_table : {false, true}) {
    at::manual_seed(3);
    Llama model(testing::tiny_config(), Kernels::fused_cpu);
    at::Tensor& table = model->token_embeddings->weight;
    {
      const at::NoGradGuard no_grad;
      table.set_data(table.to(at::kBFloat16));  // the bf16 values, in both runs
      if (!bf16_table) table.set_data(table.to(at::kFloat));
    }
    const AutocastGuard autocast(c10::Device(c10::kCPU), /*enabled=*/true);
    model->loss(tokens.narrow(1, 0, 64), tokens.narrow(1, 1, 64)).backward();
    gradients.push_back(table.grad().to(at::kFloat));
  }
  EXPECT_LE(testing::relative_error(gradients[1], gradients[0]), 1e-2);
}

TEST(NextTokenLoss, UniformLogitsCostLogV) {
  const at::Tensor logits = at::zeros({2, 5, 97});
  const at::Tensor targets = at::randint(97, {2, 5});
  EXPECT_NEAR(next_token_loss(logits, targets).item<double>(), std::log(97.0), 1e-6);
}

TEST(NextTokenLoss, IsTheMeanNegativeLogLikelihoodInFp32) {
  at::manual_seed(6);
  const at::Tensor logits = (at::randn({2, 3, 11}) * 4).to(at::kBFloat16);
  const at::Tensor targets = at::randint(11, {2, 3});
  const at::Tensor log_probs = logits.to(at::kDouble).log_softmax(-1);
  const double expected = -log_probs.gather(-1, targets.unsqueeze(-1)).mean().item<double>();
  const at::Tensor loss = next_token_loss(logits, targets);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5);
}

TEST(TrainingFlops, PalmFormulaForTheBaseModel) {
  // 6 N + 12 L H d T = 6 x 35,926,528 + 12 x 12 x 8 x 64 x 1024
  EXPECT_DOUBLE_EQ(training_flops_per_token(ModelConfig{}, 35'926'528, 1024),
                   215'559'168.0 + 75'497'472.0);
}

}  // namespace
}  // namespace mltrain
