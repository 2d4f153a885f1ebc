// Two ranks over NCCL train like one rank with the whole batch, as the MPI path does on the CPU,
// with the optimizer whole on each rank and sharded (ZeRO-1).
// Skipped with fewer than two GPUs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/interop/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

NamedTensors weights_after_12_steps(const std::filesystem::path& run) {
  return load_safetensors(run / "checkpoints" / "step_00000012" / "model.safetensors");
}

TEST(NcclTraining, TwoRanksTrainLikeOneRankWithTheWholeBatch) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.device = "cuda";
  config.train.max_steps = 12;
  config.dist.backend = "nccl";
  config.dist.bucket_mb = 0.02;  // several buckets even for the tiny model
  config.train.tf32 = false;     // full fp32, for the 1e-5 below
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  std::string mltrain = MLTRAIN_BIN_DIR "/mltrain ";
  mltrain += (dir / "run.yaml").string();  // appended: GCC 12 warns falsely on a concatenation
  const auto one = testing::run_command(
      mltrain + " --set data.micro_batch=8 --set train.run_dir=" + (dir / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const NamedTensors one_rank = weights_after_12_steps(dir / "one");
  // All-reduced, and sharded (ZeRO-1: reduce-scatter, a part of AdamW each, all-gather).
  for (const std::string zero_stage : {"0", "1"}) {
    const auto run_dir = dir / ("two_zero" + zero_stage);
    const auto two =
        testing::run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                             std::string(MLTRAIN_MPIEXEC) + " 2 " + mltrain +
                             " --set data.micro_batch=4 --set dist.zero_stage=" + zero_stage +
                             " --set train.run_dir=" + run_dir.string());
    ASSERT_EQ(two.exit_code, 0) << two.output;
    for (const auto& [name, tensor] : weights_after_12_steps(run_dir)) {
      // fp32 on both; the GPU sums in another order than one rank does: 1e-5, not bits.
      EXPECT_LE(testing::relative_error(tensor, one_rank.at(name)), 1e-5)
          << name << ", dist.zero_stage " << zero_stage;
    }
  }
}

}  // namespace
}  // namespace mltrain
