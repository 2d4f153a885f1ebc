// The CUDA path end to end on one GPU: bf16 autocast, pinned-memory loading and the NCCL
// communicator (mpirun -n 1 makes even one rank use it). Skipped, with a message, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

// One bf16 rank through NCCL (mpirun -n 1), by `binary` with `environment` set; its output.
testing::CommandResult run_one_nccl_rank(const testing::TemporaryDirectory& dir,
                                         const std::string& environment, const std::string& binary,
                                         int64_t log_every) {
  Config config = testing::tiny_run(dir.path());
  config.train.device = "cuda";
  config.train.precision = "bf16";
  config.train.max_steps = 20;
  config.train.log_every = log_every;
  config.dist.backend = "nccl";
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  return testing::run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                              std::string(MLTRAIN_MPIEXEC) + " 1 " + environment + " " +
                              MLTRAIN_BIN_DIR + "/" + binary + " " + (dir / "run.yaml").string());
}

TEST(GpuSmoke, TrainsOneRankOverNccl) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible: the GPU smoke test needs one";
  testing::TemporaryDirectory dir;
  const auto run = run_one_nccl_rank(dir, "", "mltrain", 10);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "step 20/20");
  EXPECT_CONTAINS(run.output, "CUDA 0");
}

// Steps 6 to 9 neither log nor checkpoint (log_every 5): from their gradients to the next step's,
// CUDA's sync debug mode makes any host wait on the GPU throw, the NCCL all-reduces, their events
// and the watchdog included.
TEST(GpuSmoke, StepsThatDoNotLogNeverWaitForTheGpuOverNccl) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible: the GPU smoke test needs one";
  testing::TemporaryDirectory dir;
  const auto run =
      run_one_nccl_rank(dir, "-x MLTRAIN_FAULT=forbid-host-sync:6-9", "mltrain_faults", 5);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "step 20/20");
}

}  // namespace
}  // namespace mltrain
