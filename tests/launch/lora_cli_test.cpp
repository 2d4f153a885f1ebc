// LoRA as a user runs it (lora.rank): fine-tuning a model that --export-hf wrote, the adapters
// alone training, a stopped run resuming as an unbroken one, and the export of the merged model
// that transformers loads (tests/reference/hf_check.py).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "model/interop/hf_state_dict.h"
#include "model/interop/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/config/config.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::TemporaryDirectory;

CommandResult mltrain(const std::string& arguments) {
  return testing::run_tool("mltrain", arguments);
}

std::filesystem::path checkpoint(const std::filesystem::path& run_dir, int step) {
  return run_dir / "checkpoints" / fmt::format("step_{:08d}", step);
}

bool is_adapter(const std::string& name) { return name.find(".lora_") != std::string::npos; }

// A tiny model trained 4 steps and exported (the pretrained model), then fine-tuned with LoRA
// from that export for 6 steps: every frozen weight of the fine-tuned checkpoints is the
// export's, bit for bit, the adapters moved, and the optimizer holds the adapters' state alone.
// A run stopped at step 3 and resumed ends as the unbroken one, bit for bit. The export merges the
// adapters: transformers computes from it the logits of mltrain's model with them.
TEST(LoraCli, FineTunesTheAdaptersAloneAndExportsTheMergedModel) {
  TemporaryDirectory dir;
  Config pretrain = testing::tiny_run(dir.path());
  pretrain.train.max_steps = 4;
  pretrain.train.ckpt_every = 4;
  pretrain.optim.warmup_steps = 1;
  testing::write_text(dir / "pretrain.yaml", config_to_yaml(pretrain));
  ASSERT_EQ(mltrain((dir / "pretrain.yaml").string()).exit_code, 0);
  const std::string base = (dir / "base").string();
  const CommandResult exported =
      mltrain((dir / "pretrain.yaml").string() + " --resume auto --export-hf " + base);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;

  Config tune = pretrain;
  tune.init_from = base;
  tune.lora.rank = 4;
  tune.lora.alpha = 8.0;
  tune.train.max_steps = 6;
  tune.train.ckpt_every = 3;
  tune.train.run_dir = (dir / "tuned").string();
  testing::write_text(dir / "tune.yaml", config_to_yaml(tune));
  const CommandResult tuned = mltrain((dir / "tune.yaml").string());
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_CONTAINS(tuned.output, "LoRA");

  const NamedTensors base_weights = load_safetensors(dir / "base" / "model.safetensors");
  const NamedTensors weights = load_safetensors(checkpoint(dir / "tuned", 6) / "model.safetensors");
  int adapters = 0;
  for (const auto& [name, tensor] : weights) {
    if (is_adapter(name)) {
      ++adapters;
      if (name.ends_with("lora_B.weight")) {
        EXPECT_GT(tensor.abs().max().item<double>(), 0.0) << name;
      }
      continue;
    }
    ASSERT_TRUE(base_weights.contains(name)) << name;
    EXPECT_TRUE(at::equal(tensor, base_weights.at(name))) << name << " trained";
  }
  EXPECT_EQ(adapters,
            2 * 7 * 2);  // A and B of 7 projections (q, k, v, o, gate, up, down), 2 blocks
  const NamedTensors state =
      load_safetensors(checkpoint(dir / "tuned", 6) / "optimizer.safetensors");
  EXPECT_EQ(state.size(), 3u * adapters);
  for (const auto& [name, tensor] : state) EXPECT_TRUE(is_adapter(name)) << name;

  // Stopped at step 3 and resumed: the unbroken run's weights and state, bit for bit.
  const std::string stopped_dir = (dir / "stopped").string();
  const std::string stopped = (dir / "tune.yaml").string() + " --set train.run_dir=" + stopped_dir;
  ASSERT_EQ(mltrain(stopped + " --set train.stop_at=3").exit_code, 0);
  const CommandResult resumed = mltrain(stopped + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const NamedTensors unbroken = load_safetensors(checkpoint(dir / "tuned", 6) / file);
    const NamedTensors again = load_safetensors(checkpoint(stopped_dir, 6) / file);
    ASSERT_EQ(again.size(), unbroken.size()) << file;
    for (const auto& [name, tensor] : unbroken)
      EXPECT_TRUE(at::equal(again.at(name), tensor)) << file << ": " << name;
  }

  // Another scale of the adapters is another model: refused on resume, exit 2.
  const CommandResult rescaled =
      mltrain(stopped + " --resume auto --set train.max_steps=8 --set lora.alpha=4");
  EXPECT_EQ(rescaled.exit_code, kExitUserError) << rescaled.output;
  EXPECT_CONTAINS(rescaled.output, "lora.alpha is 8 in the checkpoint, 4 in the config");

  // The export merges the adapters into a plain model that transformers loads, as the checkpoint
  // was trained (its lora.*, whatever the command line says).
  const std::string out = (dir / "export").string();
  const CommandResult merged = mltrain((dir / "tune.yaml").string() +
                                       " --resume auto --set lora.alpha=4 --export-hf " + out);
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  for (const auto& [name, tensor] : load_safetensors(dir / "export" / "model.safetensors"))
    EXPECT_FALSE(is_adapter(name)) << name;
  Llama model(tune.model, Kernels::fused_cpu, LlamaImpl::Weights::drawn, at::kCPU, tune.lora);
  load_model_weights(model, checkpoint(dir / "tuned", 6) / "model.safetensors");
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(tune.model.vocab_size, {3, 16}, at::kLong);
  save_safetensors(dir / "batch.safetensors", {{"tokens", tokens}});
  const std::string reference = fmt::format(
      "{} {}/tests/reference/hf_check.py load {} {} {}", MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR, out,
      (dir / "batch.safetensors").string(), (dir / "logits").string());
  const CommandResult checked = testing::run_command(reference);
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  at::NoGradGuard no_grad;
  const at::Tensor ours = model(tokens);
  const at::Tensor theirs = load_safetensors(dir / "logits" / "logits.safetensors").at("logits");
  EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-4);
}

// LoRA with what it does not take yet is refused before anything runs, exit 2: stage 3 (which
// would shard the frozen weights) and Muon.
TEST(LoraCli, StageThreeAndMuonAreRefused) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.lora.rank = 4;
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const std::string run = (dir / "run.yaml").string();
  const CommandResult stage3 = mltrain(run + " --set dist.zero_stage=3");
  EXPECT_EQ(stage3.exit_code, kExitUserError) << stage3.output;
  EXPECT_CONTAINS(stage3.output, "lora.rank 4 trains adapters only, and dist.zero_stage 3");
  const CommandResult muon = mltrain(run + " --set optim.name=muon");
  EXPECT_EQ(muon.exit_code, kExitUserError) << muon.output;
  EXPECT_CONTAINS(muon.output, "optim.name muon does not orthogonalise");
  const CommandResult target = mltrain(run + " --set lora.targets=q,attention");
  EXPECT_EQ(target.exit_code, kExitUserError) << target.output;
  EXPECT_CONTAINS(target.output, "lora.targets: \"attention\" is not a projection");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints"));
}

}  // namespace
}  // namespace mltrain
