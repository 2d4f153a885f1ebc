// configs/llama-1b.yaml, a model of 1.1 billion parameters: its memory plan for 8 GPUs, and, where
// this machine's memory allows, one training step on the CPU that holds what the plan says. Run
// alone (RUN_SERIAL): the step takes about 18 GB.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/config/config.h"
#include "trainer/machine/device.h"
#include "trainer/run/memory_plan.h"

namespace mltrain {
namespace {

const std::string kConfig = std::string(MLTRAIN_SOURCE_DIR) + "/configs/llama-1b.yaml";

testing::CommandResult dry_run(const std::string& arguments) {
  return testing::run_tool("mltrain", kConfig + " --dry-run " + arguments);
}

TEST(Llama1b, PlansItsMemoryOnEightGpusOf80And141GB) {
  for (const char* memory : {"80", "141"}) {
    const auto plan = dry_run(std::string("--ranks 8 --device-memory-gb ") + memory);
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    // TinyLlama-1.1B's parameter count, as Hugging Face reports it for the same shape.
    EXPECT_CONTAINS(plan.output, "1100048384 parameters, 8 ranks on CUDA, bf16 autocast");
    EXPECT_CONTAINS(plan.output,
                    "1: 1.10 GB cut among 8 ranks");  // the AdamW state, an eighth of 8.8 GB
    EXPECT_CONTAINS(plan.output, std::string("of ") + memory + ".00 GB per rank: fits");
  }
  // Twice the micro-batch outgrows 80 GB, says so and what would fit, and exits as the run would
  // (2); it fits 141 GB.
  const auto larger = dry_run("--ranks 8 --device-memory-gb 80 --set data.micro_batch=16");
  EXPECT_EQ(larger.exit_code, kExitUserError) << larger.output;
  EXPECT_CONTAINS(larger.output, "of 80.00 GB per rank: does NOT fit");
  EXPECT_CONTAINS(larger.output, "it would fit with train.activation_checkpointing=true");
  const auto on_h200 = dry_run("--ranks 8 --device-memory-gb 141 --set data.micro_batch=16");
  EXPECT_CONTAINS(on_h200.output, "of 141.00 GB per rank: fits");
}

TEST(Llama1b, TrainsAStepOnTheCpuWithinItsPlanWhereMemoryAllows) {
  testing::TemporaryDirectory dir;
  const std::vector<std::string> overrides = {"train.device=cpu",
                                              "train.precision=fp32",
                                              "data.train=" + (dir / "train_*.bin").string(),
                                              "data.val=" + (dir / "val_*.bin").string(),
                                              "data.tokenizer=",
                                              "data.seq_len=16",
                                              "data.micro_batch=1",
                                              "data.grad_accum=1",
                                              "train.max_steps=1",
                                              "optim.warmup_steps=0",
                                              "train.eval_batches=1",
                                              "train.run_dir=" + (dir / "run").string()};
  const Config config = load_config(kConfig, overrides);
  const MemoryPlan plan = plan_memory(config, {.ranks = 1, .device_memory = std::nullopt});
  const int64_t available = memory_per_rank(c10::Device(c10::kCPU), 1);
  // Room for the checkpoint's 13 GB on the way to the disk, too.
  if (available < plan.total() + 2'000'000'000) {
    GTEST_SKIP() << "the step needs about " << plan.total() / 1e9 << " GB; " << available / 1e9
                 << " GB are available";
  }
  testing::write_learnable_stream(dir / "train_000000.bin", 2000);
  testing::write_learnable_stream(dir / "val_000000.bin", 200);
  std::string arguments = kConfig;
  for (const std::string& assignment : overrides) arguments += " --set '" + assignment + "'";
  const auto trained = testing::run_tool("mltrain", arguments);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_CONTAINS(trained.output, "step 1/1");
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000001" /
                                      "optimizer.safetensors"));
  // The peak the run measured is the plan's total, within a tenth: at 16 tokens, the weights,
  // gradients, optimizer state and runtime that a model this size is made of.
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  double peak = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("peak_memory_bytes")) peak = record["peak_memory_bytes"].get<double>();
  }
  EXPECT_NEAR(peak, static_cast<double>(plan.total()), 0.1 * static_cast<double>(plan.total()));
}

}  // namespace
}  // namespace mltrain
