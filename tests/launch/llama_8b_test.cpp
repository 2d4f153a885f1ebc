// configs/llama-8b.yaml, Llama 3 8B's shape: its memory plan on 8 GPUs of 80 GB fits at
// dist.zero_stage 3 (and 2, with less room), not at 0 or 1, and the dry run says so for each stage.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

const std::string kConfig = std::string(MLTRAIN_SOURCE_DIR) + "/configs/llama-8b.yaml";

testing::CommandResult dry_run(const std::string& arguments) {
  return testing::run_tool("mltrain", kConfig + " --dry-run --ranks 8 " + arguments);
}

TEST(Llama8b, FitsEightGpusOf80GBAtStagesTwoAndThreeOnly) {
  const auto plan = dry_run("--device-memory-gb 80");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  // Llama 3 8B's parameter count, as Hugging Face reports it for Meta-Llama-3-8B.
  EXPECT_CONTAINS(plan.output, "8030261248 parameters, 8 ranks on CUDA, bf16 autocast");
  EXPECT_CONTAINS(plan.output, "this rank's part, and the units whole at once");
  EXPECT_CONTAINS(plan.output, "of 80.00 GB per rank: fits");
  EXPECT_CONTAINS(plan.output,
                  "80.00 GB: 0: 154.39 GB (does not fit); 1: 102.19 GB (does not fit)");
  EXPECT_CONTAINS(plan.output, "GB (fits); 3:");  // stage 2
  EXPECT_CONTAINS(plan.output, "GB (fits). The lowest that fits: dist.zero_stage=2");
}

// At stage 1, as llm.c would run it, the plan does not fit, and names the stage that does.
TEST(Llama8b, AtStageOneItIsRefusedNamingAStageThatFits) {
  const auto refused = dry_run("--device-memory-gb 80 --set dist.zero_stage=1");
  EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
  EXPECT_CONTAINS(refused.output, "of 80.00 GB per rank: does NOT fit");
  EXPECT_CONTAINS(refused.output, "it would fit with dist.zero_stage=2");
}

}  // namespace
}  // namespace mltrain
