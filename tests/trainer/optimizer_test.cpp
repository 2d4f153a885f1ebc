// AdamW against its closed form, the learning-rate schedules at their key steps, and gradient
// accumulation against one large batch.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <vector>

#include "common/error.h"
#include "dist/communicator.h"
#include "model/interop/hf_state_dict.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/clipping.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/muon_optimizer.h"
#include "trainer/optim/replicated_adamw.h"
#include "trainer/run/train_step.h"

namespace mltrain {
namespace {

// AdamW written out for one parameter in float64 (Loshchilov & Hutter, with bias correction).
struct ClosedFormAdamW {
  at::Tensor p, m, v;
  int64_t t = 0;
  void step(const at::Tensor& g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    p = p * (1 - lr * wd);
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const at::Tensor m_hat = m / (1 - std::pow(b1, t));
    const at::Tensor v_hat = v / (1 - std::pow(b2, t));
    p = p - lr * m_hat / (v_hat.sqrt() + eps);
  }
};

TEST(AdamW, FusedKernelMatchesTheClosedFormAndDecaysOnlyMatrices) {
  at::manual_seed(0);
  const at::Tensor matrix = at::randn({6, 5}).requires_grad_(true);
  const at::Tensor vector = at::randn({5}).requires_grad_(true);
  const AdamWOptions options{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  AdamW optimizer({unfused_parameter("matrix", matrix), unfused_parameter("vector", vector)},
                  options);
  ClosedFormAdamW matrix_ref{matrix.detach().to(at::kDouble), at::zeros({6, 5}, at::kDouble),
                             at::zeros({6, 5}, at::kDouble)};
  ClosedFormAdamW vector_ref{vector.detach().to(at::kDouble), at::zeros({5}, at::kDouble),
                             at::zeros({5}, at::kDouble)};
  for (int step = 0; step < 5; ++step) {
    const double lr = 1e-2 * (step + 1);
    matrix.mutable_grad() = at::randn({6, 5});
    vector.mutable_grad() = at::randn({5});
    matrix_ref.step(matrix.grad().to(at::kDouble), lr, 0.9, 0.95, 1e-8, 0.1);
    vector_ref.step(vector.grad().to(at::kDouble), lr, 0.9, 0.95, 1e-8, /*wd=*/0.0);
    optimizer.step(lr, /*skip=*/at::zeros({}));
    EXPECT_LE(testing::relative_error(matrix, matrix_ref.p), 1e-6) << "step " << step;
    EXPECT_LE(testing::relative_error(vector, vector_ref.p), 1e-6) << "step " << step;
  }
  EXPECT_EQ(optimizer.state().at("matrix.step").item<double>(), 5.0);
}

TEST(AdamW, ASkippedStepChangesNothing) {
  at::manual_seed(2);
  const at::Tensor matrix = at::randn({4, 3}).requires_grad_(true);
  AdamW optimizer({unfused_parameter("matrix", matrix)}, AdamWOptions{});
  matrix.mutable_grad() = at::randn({4, 3});
  optimizer.step(1e-2, /*skip=*/at::zeros({}));
  const at::Tensor weights = matrix.detach().clone();
  std::map<std::string, at::Tensor> state_before;
  for (const auto& [name, tensor] : optimizer.state()) state_before.emplace(name, tensor.clone());

  matrix.mutable_grad().fill_(NAN);  // what a skipped step would have poisoned
  optimizer.step(1e-2, /*skip=*/at::ones({}));
  EXPECT_TRUE(at::equal(matrix, weights));
  for (const auto& [name, tensor] : optimizer.state())
    EXPECT_TRUE(at::equal(tensor, state_before.at(name))) << name;
  EXPECT_EQ(optimizer.state().at("matrix.step").item<double>(), 1.0);
}

// A parameter that holds two named matrices (a fused projection) keeps its state under their names,
// as two parameters would: the same entries, of the same values, and each loads the other's state.
TEST(AdamW, AFusedParameterKeepsItsStateByPart) {
  at::manual_seed(3);
  const at::Tensor fused = at::randn({6, 5}).requires_grad_(true);
  const at::Tensor top = fused.detach().narrow(0, 0, 4).clone().requires_grad_(true);
  const at::Tensor bottom = fused.detach().narrow(0, 4, 2).clone().requires_grad_(true);
  const NamedParameter stacked{.name = "stacked",
                               .tensor = fused,
                               .parts = {{.name = "top", .first_row = 0, .rows = 4},
                                         {.name = "bottom", .first_row = 4, .rows = 2}}};
  AdamW together({stacked}, AdamWOptions{});
  AdamW apart({unfused_parameter("top", top), unfused_parameter("bottom", bottom)}, AdamWOptions{});
  for (int step = 0; step < 3; ++step) {
    fused.mutable_grad() = at::randn({6, 5});
    top.mutable_grad() = fused.grad().narrow(0, 0, 4).clone();
    bottom.mutable_grad() = fused.grad().narrow(0, 4, 2).clone();
    together.step(1e-2, at::zeros({}));
    apart.step(1e-2, at::zeros({}));
  }
  const OptimizerState by_part = together.state();
  const OptimizerState by_parameter = apart.state();
  ASSERT_EQ(by_part.size(), by_parameter.size());
  for (const auto& [name, tensor] : by_parameter)
    EXPECT_TRUE(at::allclose(by_part.at(name), tensor, 0.0, 1e-7)) << name;

  AdamW loaded({NamedParameter{stacked.name, at::zeros({6, 5}), stacked.parts}}, AdamWOptions{});
  loaded.load_state(by_parameter, "optimizer.safetensors");
  for (const auto& [name, tensor] : loaded.state())
    EXPECT_TRUE(at::equal(tensor, by_parameter.at(name))) << name;

  // A part missing from the file is named, and nothing of the other parts is loaded.
  AdamW untouched({NamedParameter{stacked.name, at::zeros({6, 5}), stacked.parts}}, AdamWOptions{});
  OptimizerState without_bottom = by_parameter;
  without_bottom.erase("bottom.exp_avg_sq");
  try {
    untouched.load_state(without_bottom, "optimizer.safetensors");
    ADD_FAILURE() << "a missing part loaded";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "optimizer.safetensors: optimizer state bottom.exp_avg_sq is missing");
  }
  for (const auto& [name, tensor] : untouched.state())
    EXPECT_EQ(tensor.count_nonzero().item<int64_t>(), 0) << name;
}

// Muon's momentum of a fused parameter is saved and loaded by part too; a missing part is named
// before anything changes.
TEST(MuonOptimizer, AFusedParameterKeepsItsMomentumByPart) {
  const World world;
  const auto communicator = make_communicator(world);
  DataParallelOptions options;
  options.muon = MuonOptions{};
  const auto fused = [] {
    return NamedParameter{.name = "model.layers.0.self_attn.qkv_proj.weight",
                          .tensor = at::zeros({12, 8}).requires_grad_(true),
                          .parts = {{.name = "q", .first_row = 0, .rows = 8},
                                    {.name = "k", .first_row = 8, .rows = 2},
                                    {.name = "v", .first_row = 10, .rows = 2}}};
  };
  MuonOptimizer optimizer({fused()}, *communicator, options);
  const OptimizerState state = optimizer.state();
  EXPECT_EQ(state.size(), 3u);
  EXPECT_EQ(state.at("k.momentum").sizes(), (std::vector<int64_t>{2, 8}));

  OptimizerState saved;
  for (const auto& [name, tensor] : state) saved.emplace(name, at::full_like(tensor, 1.0));
  saved.at("v.momentum").fill_(2.0);
  MuonOptimizer loaded({fused()}, *communicator, options);
  loaded.load_state(saved, "optimizer.safetensors");
  EXPECT_TRUE(at::equal(loaded.state().at("v.momentum"), saved.at("v.momentum")));
  EXPECT_TRUE(at::equal(loaded.state().at("q.momentum"), saved.at("q.momentum")));

  saved.erase("k.momentum");
  MuonOptimizer untouched({fused()}, *communicator, options);
  try {
    untouched.load_state(saved, "optimizer.safetensors");
    ADD_FAILURE() << "a missing part loaded";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "optimizer state k.momentum is missing");
  }
  EXPECT_EQ(untouched.state().at("q.momentum").count_nonzero().item<int64_t>(), 0);
}

// An update before the gradients are averaged would step each rank on its own gradients.
TEST(ReplicatedAdamW, UpdatesOnlyAfterTheGradientsAreReduced) {
  const World world;
  const auto communicator = make_communicator(world);
  const std::vector<at::Tensor> parameters{at::zeros({3}).requires_grad_(true),
                                           at::zeros({4}).requires_grad_(true)};
  ReplicatedAdamW optimizer(
      {unfused_parameter("a", parameters[0]), unfused_parameter("b", parameters[1])}, *communicator,
      DataParallelOptions{});
  EXPECT_THROW(optimizer.update(1e-2, at::zeros({})), std::logic_error);
  optimizer.reduce_gradients();
  EXPECT_THROW(optimizer.reduce_gradients(), std::logic_error);
  EXPECT_NO_THROW(optimizer.update(1e-2, at::zeros({})));
}

TEST(ClipByGlobalNorm, ScalesToTheLimitAndReportsTheNormBefore) {
  const at::Tensor a = at::tensor({3.0f, 0.0f});
  const at::Tensor b = at::tensor({4.0f});
  const ReducedGradients gradients{{a, b}};
  EXPECT_NEAR(clip_by_global_norm(gradients, 1.0).item<double>(), 5.0, 1e-6);
  EXPECT_NEAR(a[0].item<double>(), 0.6, 1e-5);
  EXPECT_NEAR(b[0].item<double>(), 0.8, 1e-5);
  const float clipped = b[0].item<float>();
  EXPECT_NEAR(clip_by_global_norm(gradients, 10.0).item<double>(), 1.0, 1e-5);
  EXPECT_EQ(b[0].item<float>(), clipped) << "under the limit: unchanged";
  EXPECT_NEAR(clip_by_global_norm(gradients, 0.0).item<double>(), 1.0, 1e-5) << "0: no clipping";
}

OptimConfig schedule(const std::string& name) {
  OptimConfig optim;
  optim.lr = 1.0;
  optim.min_lr = 0.1;
  optim.warmup_steps = 10;
  optim.schedule = name;
  optim.decay_fraction = 0.2;
  return optim;
}

TEST(LearningRate, WarmupIsLinearFromLrOverWarmupSteps) {
  for (const char* name : {"cosine", "linear", "constant", "wsd"}) {
    EXPECT_DOUBLE_EQ(learning_rate(schedule(name), 110, 1), 0.1) << name;
    EXPECT_DOUBLE_EQ(learning_rate(schedule(name), 110, 5), 0.5) << name;
    EXPECT_DOUBLE_EQ(learning_rate(schedule(name), 110, 10), 1.0) << name;
  }
}

TEST(LearningRate, DecaysReachMinLrAtTheEnd) {
  // 100 decay steps after 10 of warmup; step 111 is the first after the end.
  EXPECT_DOUBLE_EQ(learning_rate(schedule("cosine"), 110, 11), 1.0);
  EXPECT_NEAR(learning_rate(schedule("cosine"), 110, 61), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(schedule("cosine"), 110, 36),
              0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(schedule("cosine"), 110, 111), 0.1);
  EXPECT_NEAR(learning_rate(schedule("linear"), 110, 61), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(schedule("linear"), 110, 111), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(schedule("constant"), 110, 101), 1.0);
  // wsd: stable for 80% of 110 steps (88), then linear to min_lr over the last 22.
  EXPECT_DOUBLE_EQ(learning_rate(schedule("wsd"), 110, 88), 1.0);
  EXPECT_NEAR(learning_rate(schedule("wsd"), 110, 100), 1.0 - 0.9 * 11.0 / 22.0, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(schedule("wsd"), 110, 111), 0.1);
}

TEST(GradientAccumulation, FourMicroBatchesOfTwoEqualOneBatchOfEight) {
  at::manual_seed(3);
  const at::Tensor windows = at::randint(testing::tiny_config().vocab_size, {8, 17});
  at::manual_seed(4);
  Llama accumulated(testing::tiny_config(), Kernels::fused_cpu);
  at::manual_seed(4);
  Llama whole(testing::tiny_config(), Kernels::fused_cpu);
  const c10::Device cpu(c10::kCPU);
  double accumulated_loss = 0.0;
  for (int64_t micro = 0; micro < 4; ++micro) {
    accumulated_loss +=
        forward_backward(accumulated, windows.narrow(0, 2 * micro, 2), 4, cpu, false)
            .item<double>();
  }
  const double whole_loss = forward_backward(whole, windows, 1, cpu, false).item<double>();
  EXPECT_NEAR(accumulated_loss, whole_loss, 1e-6);
  for (const auto& item : accumulated->named_parameters()) {
    EXPECT_LE(
        testing::relative_error(item.value().grad(), whole->named_parameters()[item.key()].grad()),
        1e-6)
        << item.key();
  }
  AdamW first(hf_parameters(accumulated), {});
  AdamW second(hf_parameters(whole), {});
  first.step(1e-3, /*skip=*/at::zeros({}));
  second.step(1e-3, /*skip=*/at::zeros({}));
  // AdamW's first step moves each weight by about lr * sign(gradient): where a gradient is near
  // zero, the rounding that separates the two sums of micro-batches weighs more than in the
  // gradients themselves, hence a looser bound on the weights.
  const auto a = accumulated->named_parameters();
  const auto b = whole->named_parameters();
  for (const auto& item : a) {
    EXPECT_LE(testing::relative_error(item.value(), b[item.key()]), 5e-6) << item.key();
  }
}

}  // namespace
}  // namespace mltrain
