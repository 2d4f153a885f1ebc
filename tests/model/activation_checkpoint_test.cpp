#include "model/layers/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/kernels/autocast_region.h"
#include "model/kernels/kernels.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"
#include "trainer/machine/cpu_allocation_counter.h"

namespace mltrain {
namespace {

using testing::relative_error;
using testing::tiny_config;

struct Batch {
  at::Tensor tokens;
  at::Tensor targets;
};

Batch make_batch(const ModelConfig& config, int64_t rows, int64_t length) {
  at::manual_seed(5);
  const at::Tensor window = at::randint(config.vocab_size, {rows, length + 1}, at::kLong);
  return {window.narrow(1, 0, length), window.narrow(1, 1, length)};
}

Llama make_model(int64_t n_layers, Kernels kernels) {
  ModelConfig config = tiny_config();
  config.n_layers = n_layers;
  at::manual_seed(1);
  return Llama(config, kernels);
}

// How many checkpointed calls the graph behind `output` records.
int checkpoints_in_graph(const at::Tensor& output) {
  std::vector<torch::autograd::Node*> stack{output.grad_fn().get()};
  std::unordered_set<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find("CheckpointFunction") != std::string::npos) ++count;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      stack.push_back(edge.function.get());
    }
  }
  return count;
}

// fp32; bf16 autocast around the forward pass only, as the training step runs it; or bf16 autocast
// around backward too.
enum class Precision { fp32, bf16_forward, bf16_forward_and_backward };

struct Step {
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // every parameter's, by name
  int checkpoints = 0;
};

Step run_step(Llama& model, const Batch& batch, bool checkpointing, Precision precision) {
  model->zero_grad();
  model->set_activation_checkpointing(checkpointing);
  Step step;
  at::Tensor loss;
  {
    const AutocastGuard autocast(c10::kCPU, precision != Precision::fp32);
    loss = model->loss(batch.tokens, batch.targets);
    step.checkpoints = checkpoints_in_graph(loss);
    if (precision == Precision::bf16_forward_and_backward) loss.backward();
  }
  if (precision != Precision::bf16_forward_and_backward) loss.backward();
  step.loss = loss.detach();
  for (const auto& parameter : model->named_parameters()) {
    step.grads.emplace_back(parameter.key(), parameter.value().grad().clone());
  }
  return step;
}

class ActivationCheckpointLlama : public ::testing::TestWithParam<Kernels> {};

TEST_P(ActivationCheckpointLlama, Fp32LossAndGradientsEqualThoseWithout) {
  Llama model = make_model(3, GetParam());
  const Batch batch = make_batch(model->config(), 2, 16);
  const Step plain = run_step(model, batch, false, Precision::fp32);
  const Step checkpointed = run_step(model, batch, true, Precision::fp32);
  EXPECT_EQ(plain.checkpoints, 0);
  EXPECT_EQ(checkpointed.checkpoints, 3);
  EXPECT_TRUE(at::equal(checkpointed.loss, plain.loss));
  ASSERT_EQ(checkpointed.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_LT(relative_error(checkpointed.grads[i].second, plain.grads[i].second), 1e-6)
        << plain.grads[i].first;
  }
}

// The recomputation runs the same bf16 ops on the same values as the forward pass, and its backward
// the same ops as the plain backward: the results are the same bits.
TEST_P(ActivationCheckpointLlama, Bf16AutocastGradientsAreTheSameBits) {
  Llama model = make_model(3, GetParam());
  const Batch batch = make_batch(model->config(), 2, 16);
  for (const Precision precision :
       {Precision::bf16_forward, Precision::bf16_forward_and_backward}) {
    SCOPED_TRACE(precision == Precision::bf16_forward ? "backward after autocast"
                                                      : "backward inside autocast");
    const Step plain = run_step(model, batch, false, precision);
    const Step checkpointed = run_step(model, batch, true, precision);
    EXPECT_EQ(checkpointed.checkpoints, 3);
    EXPECT_TRUE(at::equal(checkpointed.loss, plain.loss));
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_TRUE(at::equal(checkpointed.grads[i].second, plain.grads[i].second))
          << plain.grads[i].first << ": relative error "
          << relative_error(checkpointed.grads[i].second, plain.grads[i].second);
    }
  }
}

// The recomputation in backward casts the blocks' weights to bf16 outside any autocast region;
// were those casts left in autocast's cache, the next forward pass in grad mode would read them
// after the optimizer changed the weights. Here the next step runs without checkpointing, whose
// forward pass reads the cache, and must match a model that never had a stale cache.
TEST_P(ActivationCheckpointLlama, NoCastOfAWeightOutlivesTheBackwardThatMadeIt) {
  Llama model = make_model(2, GetParam());
  Llama untouched = make_model(2, GetParam());
  const Batch batch = make_batch(model->config(), 2, 16);
  run_step(model, batch, true, Precision::bf16_forward);
  {
    const at::NoGradGuard no_grad;  // as the optimizer steps
    for (Llama* m : {&model, &untouched}) {
      for (at::Tensor& parameter : (*m)->parameters()) parameter.mul_(1.5);
    }
  }
  const Step next = run_step(model, batch, false, Precision::bf16_forward);
  const Step expected = run_step(untouched, batch, false, Precision::bf16_forward);
  EXPECT_TRUE(at::equal(next.loss, expected.loss));
  for (size_t i = 0; i < expected.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(next.grads[i].second, expected.grads[i].second))
        << expected.grads[i].first;
  }
}

// Counts its calls and keeps the gradient each call saw.
class RecordingHook : public torch::autograd::PostAccumulateGradHook {
 public:
  RecordingHook(int* calls, at::Tensor* seen) : calls_(calls), seen_(seen) {}
  void operator()(const torch::autograd::Variable& parameter) override {
    ++*calls_;
    *seen_ = parameter.grad().defined() ? parameter.grad().clone() : at::Tensor();
  }

 private:
  int* calls_;
  at::Tensor* seen_;
};

// The gradient reducer (dist/grad_reducer.h) launches a bucket's all-reduce from these hooks: each
// must run once per backward, with the parameter's whole gradient already in .grad.
TEST_P(ActivationCheckpointLlama, PostAccumulateGradHooksRunOncePerBackwardAfterTheGradient) {
  Llama model = make_model(2, GetParam());
  model->set_activation_checkpointing(true);
  const Batch batch = make_batch(model->config(), 2, 16);
  const std::vector<at::Tensor> parameters = model->parameters();
  std::vector<int> calls(parameters.size(), 0);
  std::vector<at::Tensor> seen(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        parameters[i], std::make_unique<RecordingHook>(&calls[i], &seen[i]));
  }
  for (int backward = 1; backward <= 2; ++backward) {  // two micro-steps accumulating
    model->loss(batch.tokens, batch.targets).backward();
    for (size_t i = 0; i < parameters.size(); ++i) {
      EXPECT_EQ(calls[i], backward) << "parameter " << i;
      ASSERT_TRUE(seen[i].defined()) << "parameter " << i;
      EXPECT_TRUE(at::equal(seen[i], parameters[i].grad())) << "parameter " << i;
    }
  }
  for (const at::Tensor& parameter : parameters) {
    torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ActivationCheckpointLlama,
                         ::testing::Values(Kernels::fused_cpu, Kernels::aten),
                         [](const ::testing::TestParamInfo<Kernels>& info) {
                           return info.param == Kernels::fused_cpu ? "fused" : "aten";
                         });

// What the graph of a forward pass holds until backward: every block's activations, or only each
// block's input.
TEST(ActivationCheckpointMemory, KeepsSeveralTimesLessUntilBackward) {
  Llama model = make_model(8, Kernels::fused_cpu);
  const Batch batch = make_batch(model->config(), 4, 64);
  const auto bytes_held = [&](bool checkpointing) {
    model->set_activation_checkpointing(checkpointing);
    const CpuAllocationCounter counter;
    const at::Tensor loss = model->loss(batch.tokens, batch.targets);
    return counter.allocated_bytes();
  };
  const int64_t plain = bytes_held(false);
  const int64_t checkpointed = bytes_held(true);
  RecordProperty("bytes_held_without_checkpointing", std::to_string(plain));
  RecordProperty("bytes_held_with_checkpointing", std::to_string(checkpointed));
  EXPECT_GT(checkpointed, 0);
  EXPECT_GT(plain, 4 * checkpointed) << plain << " bytes without, " << checkpointed << " with";
}

TEST(ActivationCheckpointMemory, CounterSeesLiveBytesAndThePeak) {
  const CpuAllocationCounter counter;
  {
    const at::Tensor first = at::empty({1000}, at::kFloat);
    const at::Tensor second = at::empty({500}, at::kFloat);
    EXPECT_EQ(counter.allocated_bytes(), 6000);
  }
  const at::Tensor third = at::empty({250}, at::kFloat);
  EXPECT_EQ(counter.allocated_bytes(), 1000);
  EXPECT_EQ(counter.peak_bytes(), 6000);
  EXPECT_THROW(CpuAllocationCounter(), std::logic_error);
}

// x * w with half of it dropped: a function of one input and one parameter that draws random
// numbers.
at::Tensor dropout_product(const at::Tensor& x, const at::Tensor& w) {
  return at::dropout(x * w, 0.5, /*train=*/true);
}

struct Gradients {
  at::Tensor x;
  at::Tensor w;
  at::Tensor generator_state;  // after backward
};

// The gradients of dropout_product, recorded plain or checkpointed, from seed 7, with random
// numbers drawn between forward and backward, as later layers would.
Gradients dropout_gradients(bool checkpointing, c10::Device device) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({4, 8}, device).requires_grad_(true);
  const at::Tensor w = at::randn({8}, device).requires_grad_(true);
  const auto fn = [w](const at::Tensor& input) { return dropout_product(input, w); };
  const at::Tensor y = checkpointing ? checkpointed(fn, x, {w}) : fn(x);
  at::rand({16}, device);
  y.backward(at::ones_like(y));
  return {x.grad(), w.grad(), at::globalContext().defaultGenerator(device).get_state()};
}

// Checkpointed and plain on `device`: the same gradients, and the generator left where it was.
void expect_the_same_draws(c10::Device device) {
  const Gradients plain = dropout_gradients(false, device);
  const Gradients checkpointed = dropout_gradients(true, device);
  EXPECT_TRUE(at::equal(checkpointed.x, plain.x));
  EXPECT_TRUE(at::equal(checkpointed.w, plain.w));
  EXPECT_TRUE(at::equal(checkpointed.generator_state, plain.generator_state));
}

TEST(ActivationCheckpoint, RandomOpsDrawTheForwardPassNumbersAndTheGeneratorMovesOnAsWithout) {
  expect_the_same_draws(c10::Device(c10::kCPU));
}

TEST(ActivationCheckpoint, CudaRandomOpsDrawTheForwardPassNumbers) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  expect_the_same_draws(c10::Device(c10::kCUDA, 0));
}

TEST(ActivationCheckpoint, TensorsThatNeedNoGradientGetNone) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({4, 8});
  const at::Tensor scale = at::randn({8}).requires_grad_(true);
  const at::Tensor shift = at::randn({8});
  const auto fn = [scale, shift](const at::Tensor& input) { return input * scale + shift; };
  checkpointed(fn, x, {scale, shift}).sum().backward();
  EXPECT_TRUE(at::allclose(scale.grad(), x.sum(0)));
  EXPECT_FALSE(shift.grad().defined());
}

TEST(ActivationCheckpoint, AnUndefinedGradientGivesUndefinedOnesWithoutRecomputing) {
  const at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  const at::Tensor w = at::randn({8}).requires_grad_(true);
  int calls = 0;
  const auto fn = [w, &calls](const at::Tensor& input) {
    ++calls;
    return input * w;
  };
  const at::Tensor y = checkpointed(fn, x, {w});
  ASSERT_EQ(calls, 1);
  const torch::autograd::variable_list grads = (*y.grad_fn())({at::Tensor()});
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(grads.size(), 2u);  // x's and w's
  EXPECT_FALSE(grads[0].defined());
  EXPECT_FALSE(grads[1].defined());
}

}  // namespace
}  // namespace mltrain
