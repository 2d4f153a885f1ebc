// The CUDA training step, on one GPU: gradients that stay in their buckets and a host that never
// waits for the device at a step that does not log. Skipped, with a message, without a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "dist/grad_reducer.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/optim/muon.h"
#include "trainer/run/train_step.h"
#include "trainer/run/training_run.h"

namespace mltrain {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this test needs one"

// CUDA's autograd engine accumulates gradients on its device thread, and under bf16 autocast:
// the bucket views must survive both, with no gradient copied back in.
TEST(CudaStep, GradientsStayViewsIntoTheirBucketsAfterBackward) {
  SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  at::manual_seed(5);
  Llama model(testing::tiny_config(), Kernels::aten);
  model->to(cuda);
  const auto communicator = make_communicator(World());
  GradReducer reducer(
      model->parameters(),
      assign_buckets(model->parameters(), {.bucket_mb = 0.05, .first_bucket_mb = 0.01}),
      *communicator, {});
  std::vector<at::Tensor> views;
  for (const at::Tensor& parameter : model->parameters()) views.push_back(parameter.grad());
  // Options with a device but no dtype give float, not long: the dtype is named.
  const at::Tensor windows = at::randint(testing::tiny_config().vocab_size, {4, 17},
                                         at::TensorOptions().dtype(at::kLong).device(cuda));
  for (int step = 0; step < 2; ++step) {
    window_loss(model, windows, cuda, /*bf16=*/true).backward();
    reducer.finish();
    reducer.zero_grad();
  }
  EXPECT_EQ(reducer.gradients_copied_in(), 0);
  const auto parameters = model->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(parameters[i].grad().is_same(views[i])) << "parameter " << i;
  }
}

// CUDA's sync debug mode makes every synchronising call (item(), a copy to the host, a stream
// synchronisation) throw. It is switched on from the gradients of each step that neither logs
// nor checkpoints up to the next step's gradients: the run fails if such a window synchronises.
// With each optimizer (optim.name).
class CudaStepWith : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaStepWith, StepsThatDoNotLogNeverWaitForTheDevice) {
  SKIP_WITHOUT_CUDA();
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.optim.name = GetParam();
  config.train.device = "cuda";
  config.train.precision = "bf16";
  config.train.max_steps = 12;
  config.train.log_every = 5;  // steps 1, 5, 10 and 12 read the device
  config.train.eval_every = 1000;
  auto& sync_mode = c10::cuda::warning_state();
  {  // the switch works: a read throws under it
    const at::Tensor one = at::ones({}, at::TensorOptions().device(at::kCUDA));
    sync_mode.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    EXPECT_THROW(one.item<float>(), c10::Error);
    sync_mode.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  int64_t checked_windows = 0;
  TrainingHooks hooks;
  hooks.after_gradients = [&](int64_t step, int, const std::vector<at::Tensor>&) {
    const bool reads = step == 1 || step == 5 || step == 10 || step == 12;
    checked_windows += reads ? 0 : 1;
    sync_mode.set_sync_debug_mode(reads ? c10::cuda::SyncDebugMode::L_DISABLED
                                        : c10::cuda::SyncDebugMode::L_ERROR);
  };
  EXPECT_NO_THROW(train(config, "", World(), hooks));
  sync_mode.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  EXPECT_EQ(checked_windows, 8);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaStepWith, ::testing::Values("adamw", "muon"));

// Muon on CUDA runs its Newton-Schulz iterations in bf16: one step lands within bf16's precision
// of the CPU's fp32 step.
TEST(CudaStep, AMuonStepInBf16IsTheCpusFp32StepToBf16Precision) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(6);
  const at::Tensor weight = at::randn({96, 40}) * 0.05;
  const at::Tensor grad = at::randn({96, 40}) * 0.01;
  std::vector<at::Tensor> stepped;
  for (const c10::Device device : {c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 0)}) {
    // Copies: on the CPU, to() would hand back the tensors themselves, and the step change them.
    at::Tensor matrix = weight.clone().to(device).requires_grad_(true);
    matrix.mutable_grad() = grad.clone().to(device);
    const at::Tensor momentum = at::zeros_like(matrix);
    MuonUpdate update({});
    update.add(matrix, momentum, {96});
    update.step(0.02, at::zeros({}, at::TensorOptions().device(device)));
    stepped.push_back(matrix.detach().cpu());
  }
  const at::Tensor cpu_change = stepped[0] - weight;
  const at::Tensor cuda_change = stepped[1] - weight;
  EXPECT_GT(cpu_change.abs().max().item<double>(), 1e-4) << "the step moves the weight";
  EXPECT_LE(testing::relative_error(cuda_change, cpu_change), 5e-2);
}

}  // namespace
}  // namespace mltrain
