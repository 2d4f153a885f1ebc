// The CUDA path end to end on one GPU: bf16 autocast, pinned-memory loading and the NCCL
// communicator (mpirun -n 1 makes even one rank use it). Skipped, with a message, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

TEST(GpuSmoke, TrainsOneRankOverNccl) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible: the GPU smoke test needs one";
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.device = "cuda";
  config.train.precision = "bf16";
  config.train.max_steps = 20;
  config.dist.backend = "nccl";
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const auto run = testing::run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MLTRAIN_MPIEXEC) +
      " 1 " + MLTRAIN_BIN_DIR + "/mltrain " + (dir / "run.yaml").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "step 20/20");
  EXPECT_CONTAINS(run.output, "CUDA 0");
}

}  // namespace
}  // namespace mltrain
