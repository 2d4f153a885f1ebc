// The chunked loss against the plain one it replaces, at::cross_entropy_loss(at::linear(h, W), t):
// same loss and gradients in fp32, close under bf16 autocast, nothing kept without grad, the same
// bits twice, and the same training loss and gradients through a whole tied-embedding model.
#include "model/kernels/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "model/kernels/autocast_region.h"
#include "model/kernels/cuda_kernels.h"
#include "model/kernels/kernels.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::relative_error;

struct Problem {
  at::Tensor hidden;   // [N, d]
  at::Tensor weight;   // [V, d]
  at::Tensor targets;  // [N]
};

// Logits of order one, as a trained model's are, so the softmax is neither flat nor one-hot.
Problem random_problem(int64_t rows, int64_t dim, int64_t vocab) {
  at::manual_seed(3);
  return {at::randn({rows, dim}), at::randn({vocab, dim}) * 0.5, at::randint(vocab, {rows})};
}

using LossFunction =
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

struct LossAndGradients {
  at::Tensor loss;
  at::Tensor grad_hidden;
  at::Tensor grad_weight;
};

// The loss of fresh leaf copies of the inputs, and their gradients after backward of
// grad_scale * loss (the trainer scales by 1 / grad_accum, which backward must pass on).
LossAndGradients run(const LossFunction& loss_of, const Problem& problem, double grad_scale = 1.0) {
  const at::Tensor hidden = problem.hidden.clone().requires_grad_();
  const at::Tensor weight = problem.weight.clone().requires_grad_();
  const at::Tensor loss = loss_of(hidden, weight, problem.targets);
  (loss * grad_scale).backward();
  return {loss.detach(), hidden.grad(), weight.grad()};
}

at::Tensor plain_loss(const at::Tensor& hidden, const at::Tensor& weight,
                      const at::Tensor& targets) {
  return at::cross_entropy_loss(at::linear(hidden, weight).to(at::kFloat), targets);
}

LossFunction chunked_loss(int64_t chunk_rows) {
  return
      [chunk_rows](const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
        return linear_cross_entropy(hidden, weight, targets, chunk_rows);
      };
}

void expect_same_loss_and_gradients(const LossAndGradients& actual,
                                    const LossAndGradients& expected, double tolerance) {
  EXPECT_LE(relative_error(actual.loss, expected.loss), tolerance);
  EXPECT_LE(relative_error(actual.grad_hidden, expected.grad_hidden), tolerance);
  EXPECT_LE(relative_error(actual.grad_weight, expected.grad_weight), tolerance);
}

TEST(LinearCrossEntropy, ChunksTakeAboutFourMebibytesOfLogits) {
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096), 256);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(32000), 32);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(int64_t{1} << 22), 1);  // never zero rows
}

// 37 rows in chunks of 8: four full chunks and a short one.
TEST(LinearCrossEntropy, MatchesThePlainLossAndGradientsInFp32) {
  const Problem problem = random_problem(37, 24, 50);
  const LossAndGradients plain = run(plain_loss, problem, 0.25);
  const LossAndGradients chunked = run(chunked_loss(8), problem, 0.25);
  EXPECT_EQ(chunked.loss.scalar_type(), at::kFloat);
  EXPECT_EQ(chunked.loss.dim(), 0);
  expect_same_loss_and_gradients(chunked, plain, 1e-6);
}

// The default chunking: a vocabulary large enough for 10 rows a chunk, over 3 chunks.
TEST(LinearCrossEntropy, DefaultChunkingMatchesThePlainLoss) {
  const Problem problem = random_problem(25, 8, 100'000);
  ASSERT_EQ(linear_cross_entropy_chunk_rows(100'000), 10);
  const LossAndGradients plain = run(plain_loss, problem);
  const LossAndGradients chunked =
      run([](const at::Tensor& h, const at::Tensor& w,
             const at::Tensor& t) { return linear_cross_entropy(h, w, t); },
          problem);
  expect_same_loss_and_gradients(chunked, plain, 1e-6);
}

// Row weights as a loss mask gives them: 0 for the rows that are no target, one over the targets
// for the rest. The reference is ATen's per-row loss with labels -100 where the mask is 0, summed
// and divided by the count, as transformers takes a masked loss.
TEST(LinearCrossEntropy, RowWeightsGiveTheMaskedMeanAndItsGradients) {
  const Problem problem = random_problem(37, 24, 50);
  const at::Tensor mask = at::arange(37).remainder(3).ne(0);  // 24 of the 37 rows
  const at::Tensor row_weights = mask.to(at::kFloat) / mask.sum().to(at::kFloat);
  const LossFunction masked_reference = [&](const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets) {
    return at::cross_entropy_loss(at::linear(hidden, weight), targets.masked_fill(~mask, -100), {},
                                  at::Reduction::Sum, /*ignore_index=*/-100) /
           24.0;
  };
  const LossFunction weighted = [&](const at::Tensor& hidden, const at::Tensor& weight,
                                    const at::Tensor& targets) {
    return linear_cross_entropy(hidden, weight, targets, 8, row_weights);
  };
  const LossAndGradients expected = run(masked_reference, problem, 0.25);
  expect_same_loss_and_gradients(run(weighted, problem, 0.25), expected, 1e-6);
  // The rows that are no target have no gradient: a row's hidden gradient is its own.
  EXPECT_EQ(run(weighted, problem).grad_hidden.index({~mask}).abs().max().item<float>(), 0.0f);
  // And the plain path of the model's loss takes the same weights.
  const at::Tensor hidden = problem.hidden.clone().requires_grad_();
  const at::Tensor logits = at::linear(hidden, problem.weight).unsqueeze(0);
  const at::Tensor plain =
      next_token_loss(logits, problem.targets.unsqueeze(0), row_weights.unsqueeze(0));
  EXPECT_LE(relative_error(plain.detach(), expected.loss), 1e-6);
}

TEST(LinearCrossEntropy, GivesAGradientOnlyToInputsThatWantOne) {
  const Problem problem = random_problem(37, 24, 50);
  const at::Tensor weight = problem.weight.clone().requires_grad_();
  linear_cross_entropy(problem.hidden, weight, problem.targets, 8).backward();
  const at::Tensor expected_weight = problem.weight.clone().requires_grad_();
  plain_loss(problem.hidden, expected_weight, problem.targets).backward();
  EXPECT_LE(relative_error(weight.grad(), expected_weight.grad()), 1e-6);
}

// Both paths multiply in bf16 and take the softmax in fp32, so they differ by rounding only. The
// logits are the same bf16 products, so the losses agree to fp32 rounding (measured 8e-8). The
// plain path rounds the whole weight gradient to bf16 once (relative 2^-9 per element), the
// chunked one rounds each chunk's share and sums the shares in fp32 (measured 2.3e-3 apart).
TEST(LinearCrossEntropy, UnderBf16AutocastIsCloseToThePlainLoss) {
  const Problem problem = random_problem(37, 24, 50);
  const LossAndGradients fp32 = run(plain_loss, problem);
  LossAndGradients plain;
  LossAndGradients chunked;
  {
    const AutocastGuard autocast(c10::Device(c10::kCPU), /*enabled=*/true);
    plain = run(plain_loss, problem);
    chunked = run(chunked_loss(8), problem);
  }
  EXPECT_EQ(chunked.loss.scalar_type(), at::kFloat);
  EXPECT_EQ(chunked.grad_hidden.scalar_type(), at::kFloat);
  EXPECT_EQ(chunked.grad_weight.scalar_type(), at::kFloat);
  EXPECT_LE(relative_error(chunked.loss, plain.loss), 1e-5);
  EXPECT_LE(relative_error(chunked.grad_hidden, plain.grad_hidden), 1e-2);
  EXPECT_LE(relative_error(chunked.grad_weight, plain.grad_weight), 1e-2);
  // The matmuls really ran in bf16: the result is nearer the bf16 plain path than the fp32 one.
  EXPECT_LT(relative_error(chunked.grad_hidden, plain.grad_hidden),
            relative_error(chunked.grad_hidden, fp32.grad_hidden));
}

TEST(LinearCrossEntropy, WithoutGradComputesTheSameLossAndKeepsNothing) {
  const Problem problem = random_problem(37, 24, 50);
  const at::Tensor hidden = problem.hidden.clone().requires_grad_();
  const at::Tensor weight = problem.weight.clone().requires_grad_();
  const at::Tensor with_grad = linear_cross_entropy(hidden, weight, problem.targets, 8);
  at::Tensor without_grad;
  {
    const at::NoGradGuard no_grad;
    without_grad = linear_cross_entropy(hidden, weight, problem.targets, 8);
  }
  EXPECT_FALSE(without_grad.requires_grad());
  EXPECT_EQ(without_grad.grad_fn(), nullptr);
  EXPECT_TRUE(with_grad.requires_grad());
  EXPECT_TRUE(at::equal(without_grad, with_grad.detach()));
  const at::Tensor constants =
      linear_cross_entropy(problem.hidden, problem.weight, problem.targets, 8);
  EXPECT_EQ(constants.grad_fn(), nullptr);
  EXPECT_TRUE(at::equal(constants, with_grad.detach()));
}

TEST(LinearCrossEntropy, TwoCallsGiveTheSameBits) {
  const Problem problem = random_problem(37, 24, 50);
  const LossAndGradients first = run(chunked_loss(8), problem);
  const LossAndGradients second = run(chunked_loss(8), problem);
  EXPECT_TRUE(at::equal(first.loss, second.loss));
  EXPECT_TRUE(at::equal(first.grad_hidden, second.grad_hidden));
  EXPECT_TRUE(at::equal(first.grad_weight, second.grad_weight));
}

struct ModelLossAndGradients {
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> gradients;
};

ModelLossAndGradients model_loss(Kernels kernels, const at::Tensor& window) {
  ModelConfig config = testing::tiny_config();
  config.vocab_size = 20'000;  // 52 rows a chunk: the 3 x 40 positions take three chunks
  at::manual_seed(11);
  Llama model(config, kernels);
  const int64_t length = window.size(1) - 1;
  const at::Tensor loss = model->loss(window.narrow(1, 0, length), window.narrow(1, 1, length));
  loss.backward();
  ModelLossAndGradients result{loss.detach(), {}};
  for (const auto& item : model->named_parameters()) {
    result.gradients.emplace_back(item.key(), item.value().grad());
  }
  return result;
}

// The tied matrix gets its gradient from both the lookup and the chunked output projection.
TEST(LinearCrossEntropy, TiedModelLossMatchesThePlainPath) {
  at::manual_seed(12);
  const at::Tensor window = at::randint(20'000, {3, 41});
  const ModelLossAndGradients aten = model_loss(Kernels::aten, window);
  const ModelLossAndGradients fused = model_loss(Kernels::fused_cpu, window);
  EXPECT_LE(relative_error(fused.loss, aten.loss), 1e-6);
  ASSERT_EQ(fused.gradients.size(), aten.gradients.size());
  for (size_t i = 0; i < aten.gradients.size(); ++i) {
    const std::string& name = aten.gradients[i].first;
    ASSERT_TRUE(fused.gradients[i].second.defined()) << name;
    EXPECT_LE(relative_error(fused.gradients[i].second, aten.gradients[i].second), 1e-6) << name;
  }
}

TEST(LinearCrossEntropy, RefusesASecondDerivative) {
  const at::Tensor hidden = at::randn({6, 8}, at::requires_grad());
  const at::Tensor weight = at::randn({10, 8}, at::requires_grad());
  const at::Tensor loss = linear_cross_entropy(hidden, weight, at::randint(10, {6}));
  EXPECT_THROW(torch::autograd::grad({loss}, {hidden}, {}, /*retain_graph=*/true,
                                     /*create_graph=*/true),
               c10::Error);
}

// train.kernels auto is the fused CPU kernels on the CPU only: CUDA keeps the ATen layers and the
// plain loss until the CUDA kernels have passed on a GPU. fused, which runs saved before the CUDA
// kernels hold, stays just that; fused_cuda asks for them, which a build against a CUDA LibTorch
// has.
TEST(ChooseKernels, AutoAndFusedFuseOnTheCpuOnlyFusedCudaOnBothAtenEverywhere) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device cuda(c10::kCUDA, 0);
  for (const std::string name : {"auto", "fused"}) {
    EXPECT_EQ(choose_kernels(name, cpu), Kernels::fused_cpu) << name;
    EXPECT_EQ(choose_kernels(name, cuda), Kernels::aten) << name;
  }
  EXPECT_EQ(choose_kernels("fused_cuda", cpu), Kernels::fused_cpu);
  if (cuda_kernels_built()) {
    EXPECT_EQ(choose_kernels("fused_cuda", cuda), Kernels::fused_cuda);
  } else {
    EXPECT_THROW(choose_kernels("fused_cuda", cuda), UserError);
  }
  EXPECT_EQ(choose_kernels("aten", cpu), Kernels::aten);
  EXPECT_EQ(choose_kernels("aten", cuda), Kernels::aten);
  try {
    choose_kernels("fast", cpu);
    ADD_FAILURE() << "a name that is none of auto, fused, fused_cuda and aten was taken";
  } catch (const UserError& error) {
    EXPECT_STREQ(error.what(), "train.kernels is auto, fused, fused_cuda or aten, not 'fast'");
  }
}

}  // namespace
}  // namespace mltrain
