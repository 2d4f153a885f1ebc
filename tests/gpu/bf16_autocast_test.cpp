// bf16 autocast on a GPU against fp32 on the same GPU: the loss and the gradients agree within
// what bf16 rounding explains, and the forward really ran in bf16.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <vector>

#include "model/kernels/autocast_region.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"
#include "trainer/run/train_step.h"

namespace mltrain {
namespace {

using testing::tiny_config;

struct LossAndGradients {
  double loss;
  at::Tensor gradients;  // every parameter's gradient, flattened into one vector
};

LossAndGradients loss_and_gradients(Llama& model, const at::Tensor& window, bool bf16) {
  model->zero_grad();
  const at::Tensor loss = window_loss(model, window, window.device(), bf16);
  loss.backward();
  std::vector<at::Tensor> gradients;
  for (const at::Tensor& parameter : model->parameters()) {
    gradients.push_back(parameter.grad().flatten());
  }
  return {loss.item<double>(), at::cat(gradients)};
}

class Bf16Autocast : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    at::manual_seed(30);
    model = Llama(tiny_config(), Kernels::aten);
    model->to(at::kCUDA);
    window = at::randint(tiny_config().vocab_size, {4, 33}, at::TensorOptions().dtype(at::kLong))
                 .to(at::kCUDA);
  }
  Llama model{nullptr};
  at::Tensor window;
};

// bf16 keeps 8 significant bits, a rounding error of 2^-8 = 0.4% per value; matmuls accumulate in
// fp32, so the loss, an average over many such products, should move by well under 1%: 2e-2 is
// the bound. A gradient element is a difference of such products and can lose more, relative to
// itself, so the gradients are held to their direction: cosine similarity over 0.99.
TEST_F(Bf16Autocast, LossAndGradientsAgreeWithFp32) {
  const LossAndGradients fp32 = loss_and_gradients(model, window, /*bf16=*/false);
  const LossAndGradients bf16 = loss_and_gradients(model, window, /*bf16=*/true);
  EXPECT_LT(std::abs(bf16.loss - fp32.loss) / fp32.loss, 2e-2)
      << "fp32 " << fp32.loss << ", bf16 " << bf16.loss;
  // Equal losses would mean autocast changed nothing.
  EXPECT_NE(bf16.loss, fp32.loss);
  const double cosine =
      at::cosine_similarity(bf16.gradients.to(at::kDouble), fp32.gradients.to(at::kDouble), 0)
          .item<double>();
  EXPECT_GT(cosine, 0.99);
  EXPECT_EQ(bf16.gradients.scalar_type(), at::kFloat) << "master weights and gradients stay fp32";
}

TEST_F(Bf16Autocast, ForwardRunsItsMatmulsInBf16) {
  at::NoGradGuard no_grad;
  const at::Tensor tokens = window.narrow(1, 0, 32);
  {
    const AutocastGuard autocast(window.device(), /*enabled=*/true);
    // The logits come out of the output projection, the last matmul: its dtype is the one it ran
    // in.
    EXPECT_EQ(model(tokens).scalar_type(), at::kBFloat16);
    EXPECT_EQ(model->layers[0]
                  ->attn(at::randn({1, 8, tiny_config().d_model}, window.device()),
                         model->rotary->cos(0, 8), model->rotary->sin(0, 8))
                  .scalar_type(),
              at::kBFloat16);
  }
  EXPECT_EQ(model(tokens).scalar_type(), at::kFloat) << "autocast ends with its guard";
}

}  // namespace
}  // namespace mltrain
