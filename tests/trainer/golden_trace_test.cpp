// The golden loss trace, as llm.c's test_gpt2.cu keeps one: twelve optimizer steps of a small model
// in fp32 on the CPU, with gradient accumulation, warmup, a cosine schedule, clipping and weight
// decay, run by mltrain and by the independent Python reference (tests/reference/
// train_reference.py, torch.optim.AdamW, and tests/reference/muon.py for Muon) from the same
// initial weights on the same windows. Every step's loss and the final weights must agree within
// 1e-5; and the comparison must be sharp enough to see weight decay on the norms, the schedule one
// step late, or Muon without Nesterov momentum.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/error.h"
#include "common/file_tree.h"
#include "data/blended_sampler.h"
#include "data/loader.h"
#include "data/token_windows.h"
#include "model/interop/hf_state_dict.h"
#include "model/layers/llama.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/run/evaluation.h"
#include "trainer/run/training_run.h"

namespace mltrain {
namespace {

using testing::relative_error;
using testing::TemporaryDirectory;

constexpr int64_t kSteps = 12;
constexpr double kTolerance = 1e-5;

Config golden_run(const TemporaryDirectory& dir, const std::string& optimizer) {
  Config config = testing::tiny_run(dir.path());
  config.optim.name = optimizer;
  config.optim.muon_lr = 1.5 * config.optim.lr;  // the reference must scale the schedule to it
  config.train.max_steps = kSteps;
  config.train.log_every = 1;
  config.train.ckpt_every = kSteps;
  config.optim.warmup_steps = 3;
  config.optim.schedule = "cosine";
  config.optim.grad_clip = 0.5;  // below the first steps' norms: clipping acts
  config.optim.weight_decay = 0.1;
  return config;
}

// What the reference needs to know of the run.
std::string reference_config(const Config& config) {
  const ModelConfig& m = config.model;
  const OptimConfig& o = config.optim;
  const nlohmann::json json = {{"model",
                                {{"n_layers", m.n_layers},
                                 {"n_q_heads", m.n_q_heads},
                                 {"n_kv_heads", m.n_kv_heads},
                                 {"head_dim", m.head_dim},
                                 {"norm_eps", m.norm_eps},
                                 {"rope_theta", m.rope_theta}}},
                               {"optim",
                                {{"lr", o.lr},
                                 {"min_lr", o.min_lr},
                                 {"warmup_steps", o.warmup_steps},
                                 {"max_steps", config.train.max_steps},
                                 {"beta1", o.beta1},
                                 {"beta2", o.beta2},
                                 {"eps", o.eps},
                                 {"weight_decay", o.weight_decay},
                                 {"grad_clip", o.grad_clip},
                                 {"name", o.name},
                                 {"muon_lr", o.muon_lr},
                                 {"muon_momentum", o.muon_momentum},
                                 {"muon_ns_steps", o.muon_ns_steps}}}};
  return json.dump();
}

std::vector<int64_t> window_indices(const std::vector<BlendedSampler::Sample>& samples) {
  std::vector<int64_t> indices;
  for (const BlendedSampler::Sample& sample : samples) indices.push_back(sample.window);
  return indices;
}

// The windows of every micro-step of the run, "batches" [steps, grad_accum, micro_batch,
// seq_len + 1], as its loader reads them (the sampler has tests of its own), and with loss masks
// whether each of their targets counts, "targets" [steps, grad_accum, micro_batch, seq_len].
NamedTensors run_batches(const Config& config) {
  const TokenWindows windows(config.data.train, config.data.seq_len, config.model.vocab_size);
  const BatchLayout layout{config.data.micro_batch, config.data.grad_accum, 1};
  BlendedSampler sampler({{windows.num_windows(), 1.0, static_cast<uint64_t>(config.data.seed)}},
                         layout, {0, {0}});
  std::vector<at::Tensor> steps;
  std::vector<at::Tensor> step_targets;
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<at::Tensor> micro_steps;
    std::vector<at::Tensor> micro_targets;
    for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
      const std::vector<int64_t> indices =
          window_indices(sampler.windows(step * layout.global_batch(), micro, 0));
      micro_steps.push_back(gather_windows(windows, indices));
      if (windows.has_loss_masks()) micro_targets.push_back(gather_targets(windows, indices));
    }
    steps.push_back(at::stack(micro_steps));
    if (windows.has_loss_masks()) step_targets.push_back(at::stack(micro_targets));
  }
  NamedTensors batches = {{"batches", at::stack(steps)}};
  if (windows.has_loss_masks()) batches["targets"] = at::stack(step_targets);
  return batches;
}

std::vector<double> logged_losses(const std::filesystem::path& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("loss")) losses.push_back(record["loss"].get<double>());
  }
  return losses;
}

// How far the reference's trace (`fault`: one it was asked to get wrong) is from mltrain's: the
// largest relative error of a step's loss or of a final weight.
double distance_to_reference(const TemporaryDirectory& dir, const std::string& fault,
                             const std::vector<double>& losses, const NamedTensors& weights) {
  const auto out = dir / ("reference" + fault + ".safetensors");
  const std::string command = fmt::format(
      "{} {}/tests/reference/train_reference.py {} {} {} {} {}", MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR,
      (dir / "reference.json").string(), (dir / "initial.safetensors").string(),
      (dir / "batches.safetensors").string(), out.string(), fault);
  const testing::CommandResult run = testing::run_command(command);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  if (run.exit_code != 0) return INFINITY;
  const NamedTensors reference = load_safetensors(out);
  double distance = 0.0;
  for (int64_t step = 0; step < kSteps; ++step) {
    const double expected = reference.at("losses")[step].item<double>();
    distance = std::max(distance, std::abs(losses[step] - expected) / std::abs(expected));
  }
  for (const auto& [name, tensor] : weights)
    distance = std::max(distance, relative_error(tensor, reference.at(name)));
  return distance;
}

// Trains `config`'s golden run (in `dir`, its run directory dir/run), and checks it against the
// reference, and against the reference with each of `faults`. Returns the run's losses.
std::vector<double> expect_reference_trace(const TemporaryDirectory& dir, const Config& config,
                                           const std::vector<std::string>& faults) {
  remove_tree(dir / "run");
  // The run's initial weights: seeded by data.seed before the model is built, as the run does.
  at::manual_seed(config.data.seed);
  save_model_weights(Llama(config.model, Kernels::aten), dir / "initial.safetensors");
  save_safetensors(dir / "batches.safetensors", run_batches(config));
  testing::write_text(dir / "reference.json", reference_config(config));

  train(config);
  const std::vector<double> losses = logged_losses(dir / "run" / "metrics.jsonl");
  EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps));
  if (losses.size() != static_cast<size_t>(kSteps)) return losses;
  const NamedTensors weights = load_safetensors(
      dir / "run" / "checkpoints" / fmt::format("step_{:08d}", kSteps) / "model.safetensors");

  EXPECT_LE(distance_to_reference(dir, "", losses, weights), kTolerance);
  for (const std::string& fault : faults)
    EXPECT_GT(distance_to_reference(dir, fault, losses, weights), 10 * kTolerance) << fault;
  return losses;
}

TEST(GoldenTrace, TwelveStepsMatchThePythonReference) {
  TemporaryDirectory dir;
  expect_reference_trace(dir, golden_run(dir, "adamw"), {"decay-norms", "shifted-schedule"});
}

// Muon on the blocks' matrices, AdamW on the embedding and the norms, at a peak learning rate of
// their own.
TEST(GoldenTrace, TwelveStepsOfMuonMatchThePythonReference) {
  TemporaryDirectory dir;
  expect_reference_trace(dir, golden_run(dir, "muon"),
                         {"no-nesterov", "shifted-schedule", "decay-norms"});
}

// With loss masks the loss is the mean over the step's targets that count, as transformers takes
// it with labels -100 and the step's count: micro-batches of 4 with grad_accum 4 and of 16 with
// grad_accum 1 (the same global batch) each match the reference and so each other, and the
// reference that averages the micro-steps' own means is seen to differ.
TEST(GoldenTrace, TheMaskedLossOverTheStepsTargetsMatchesThePythonReference) {
  TemporaryDirectory dir;
  testing::write_masked_learnable_corpus(dir / "chat");
  Config config = golden_run(dir, "adamw");
  config.data.train = (dir / "chat" / "train_*.bin").string();
  config.data.val = (dir / "chat" / "val_*.bin").string();
  config.data.micro_batch = 4;
  config.data.grad_accum = 4;
  const std::vector<double> accumulated = expect_reference_trace(dir, config, {"mean-of-means"});
  config.data.micro_batch = 16;
  config.data.grad_accum = 1;
  const std::vector<double> whole = expect_reference_trace(dir, config, {});
  ASSERT_EQ(accumulated.size(), whole.size());
  for (size_t step = 0; step < whole.size(); ++step)
    EXPECT_NEAR(accumulated[step], whole[step], kTolerance * whole[step]) << "step " << step + 1;
}

// A validation set without a target that counts is an error that says why, not a NaN.
TEST(GoldenTrace, EvaluatingWindowsWithoutTargetsIsAnError) {
  TemporaryDirectory dir;
  testing::write_masked_learnable_corpus(dir / "chat", /*targets_wanted=*/false);
  const Config config = golden_run(dir, "adamw");
  Llama model(config.model, Kernels::fused_cpu);
  const TokenWindows windows((dir / "chat" / "val_*.bin").string(), 16, 32);
  const auto communicator = make_communicator(World());
  try {
    evaluate(model, windows, {.micro_batch = 4, .grad_accum = 1, .world_size = 1}, 0, at::kCPU,
             false, *communicator, std::nullopt);
    FAIL() << "windows without targets were evaluated";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "hold no target that counts");
  }
}

// Evaluation on a masked corpus is the mean over every validation target that counts, whatever the
// batches: checked against the model's per-token losses of all the windows at once.
TEST(GoldenTrace, MaskedEvaluationIsTheMeanOverTheTargetsThatCount) {
  TemporaryDirectory dir;
  testing::write_masked_learnable_corpus(dir / "chat");
  Config config = golden_run(dir, "adamw");
  config.model.init_std = 0.5;  // tokens' losses far apart, as a trained model's are
  at::manual_seed(1);
  Llama model(config.model, Kernels::fused_cpu);
  const TokenWindows windows((dir / "chat" / "val_*.bin").string(), 16, 32);
  const auto communicator = make_communicator(World());
  const Evaluation evaluation =
      evaluate(model, windows, {.micro_batch = 5, .grad_accum = 1, .world_size = 1},
               /*eval_batches=*/0, at::kCPU, /*bf16=*/false, *communicator, std::nullopt);

  std::vector<int64_t> all(static_cast<size_t>(windows.num_windows()));
  std::iota(all.begin(), all.end(), 0);
  const at::Tensor tokens = gather_windows(windows, all);
  const at::Tensor mask = gather_targets(windows, all).to(at::kFloat);
  at::NoGradGuard no_grad;
  const at::Tensor logits = model(tokens.narrow(1, 0, 16));
  const at::Tensor losses = at::cross_entropy_loss(
      logits.flatten(0, 1), tokens.narrow(1, 1, 16).flatten(), {}, at::Reduction::None);
  const double expected =
      (losses * mask.flatten()).sum().item<double>() / mask.sum().item<double>();
  EXPECT_NEAR(evaluation.loss, expected, 1e-5 * expected);
  EXPECT_EQ(evaluation.tokens, mask.sum().item<int64_t>());
  // Not the mean over every token, which the check could not tell apart otherwise.
  EXPECT_GT(std::abs(losses.mean().item<double>() - expected), 1e-3);
}

}  // namespace
}  // namespace mltrain
