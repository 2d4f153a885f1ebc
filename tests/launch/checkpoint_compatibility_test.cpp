// Checkpoints written by earlier versions of mltrain still load and train on as they would have.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "model/interop/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::relative_error;
using testing::TemporaryDirectory;

// tests/launch/checkpoints_before_fused_projections holds, for AdamW and for Muon, a tiny run's
// checkpoint at step 4 and its weights at step 8, written by mltrain before the projections were
// fused (q, k, v and gate, up as parameters of their own; see the README there). Resumed from
// step 4, the run must reach those weights at step 8: the weights, AdamW's moments and Muon's
// momenta all join into the fused parameters, and Muon still orthogonalises each projection on
// its own. The fused products round differently from the separate ones (5e-8 apart here), as
// another CPU's GEMMs would, hence the tolerance: a projection orthogonalised with its neighbours
// moves the weights by 2e-4 to 5e-2, a moment in the wrong rows by more.
TEST(CheckpointCompatibility, ACheckpointFromBeforeFusedProjectionsResumesAsItWouldHave) {
  const std::filesystem::path fixtures = std::filesystem::path(MLTRAIN_SOURCE_DIR) /
                                         "tests/launch/checkpoints_before_fused_projections";
  for (const std::string optimizer : {"adamw", "muon"}) {
    SCOPED_TRACE(optimizer);
    TemporaryDirectory dir;
    // The fixture's run.yaml: the learnable streams tiny_run writes, as that run read them.
    Config config = testing::tiny_run(dir.path());
    config.optim.name = optimizer;
    config.optim.warmup_steps = 2;
    config.train.max_steps = 8;
    config.train.ckpt_every = 4;
    config.train.log_every = 2;
    config.train.eval_every = 100;
    const auto config_path = dir / "run.yaml";
    testing::write_text(config_path, config_to_yaml(config));
    const auto saved = dir / "step_00000004";
    std::filesystem::copy(fixtures / optimizer / "step_00000004", saved);

    const CommandResult resumed =
        testing::run_tool("mltrain", config_path.string() + " --resume " + saved.string());
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;

    const NamedTensors expected =
        load_safetensors(fixtures / optimizer / "step_00000008_model.safetensors");
    const NamedTensors reached =
        load_safetensors(dir / "run/checkpoints/step_00000008/model.safetensors");
    ASSERT_EQ(reached.size(), expected.size());
    for (const auto& [name, tensor] : expected)
      EXPECT_LE(relative_error(reached.at(name), tensor), 1e-5) << name;
  }
}

}  // namespace
}  // namespace mltrain
