// Hugging Face export and import as a user runs them: mltrain --export-hf on a trained run,
// --eval-only on a directory that transformers saved, model.init_from; what they print and how they
// exit. transformers (tests/reference/hf_check.py) is the reference of what the files mean.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/loader.h"
#include "data/token_windows.h"
#include "model/interop/hf_state_dict.h"
#include "tests/launch/trained_run.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::TemporaryDirectory;
using testing::trained_run;

CommandResult mltrain(const std::string& arguments) {
  return testing::run_tool("mltrain", arguments);
}

// Runs tests/reference/hf_check.py; its logits.safetensors and info.json land in `out_dir`.
void run_reference(const std::string& arguments, const std::filesystem::path& out_dir) {
  const std::string command = fmt::format("{} {}/tests/reference/hf_check.py {} {}", MLTRAIN_PYTHON,
                                          MLTRAIN_SOURCE_DIR, arguments, out_dir.string());
  const CommandResult run = testing::run_command(command);
  if (run.exit_code != 0) throw std::runtime_error(command + "\n" + run.output);
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The val_loss of the last --eval-only in the run's metrics.jsonl.
double last_eval_only_loss(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  double loss = -1.0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "eval_only") loss = record["val_loss"].get<double>();
  }
  return loss;
}

// The loss an --eval-only printed ("val loss 1.234567").
double printed_val_loss(const std::string& output) {
  const size_t at = output.find("val loss ");
  if (at == std::string::npos) throw std::runtime_error("no val loss in:\n" + output);
  return std::stod(output.substr(at + 9));
}

// The logits of a batch of random tokens from mltrain's model of the run's checkpoint at step 4
// and from transformers' of its export in `out`.
struct ExportedLogits {
  at::Tensor tokens, mltrain, transformers;
};
ExportedLogits logits_of_export(const TemporaryDirectory& dir, const ModelConfig& config,
                                const std::string& out) {
  Llama model(config, Kernels::fused_cpu);
  load_model_weights(model, dir / "run" / "checkpoints" / "step_00000004" / "model.safetensors");
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(config.vocab_size, {3, 16}, at::kLong);
  save_safetensors(dir / "batch.safetensors", {{"tokens", tokens}});
  run_reference(fmt::format("load {} {}", out, (dir / "batch.safetensors").string()), dir / "out");
  at::NoGradGuard no_grad;
  return {tokens, model(tokens), load_safetensors(dir / "out" / "logits.safetensors").at("logits")};
}

TEST(HfCli, ExportsATrainedRunThatTransformersLoads) {
  TemporaryDirectory dir;
  const std::string config = trained_run(dir);
  const std::string out = (dir / "export").string();
  const CommandResult exported = mltrain(config + " --resume auto --export-hf " + out);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_CONTAINS(exported.output, "the run has no tokenizer");
  EXPECT_CONTAINS(exported.output, "AutoModelForCausalLM.from_pretrained(\"" + out + "\")");

  const ExportedLogits logits = logits_of_export(dir, testing::tiny_run(dir.path()).model, out);
  EXPECT_LE((logits.mltrain - logits.transformers).abs().max().item<double>(), 1e-4);

  // Evaluating the export is evaluating the checkpoint. The checkpoint's evaluation is recorded in
  // its run; the export belongs to no run, and the run of the config stays byte for byte as it was.
  const CommandResult checkpoint = mltrain(config + " --eval-only --resume auto");
  ASSERT_EQ(checkpoint.exit_code, 0) << checkpoint.output;
  EXPECT_NEAR(last_eval_only_loss(dir / "run"), printed_val_loss(checkpoint.output), 1e-6);
  const auto run_files = testing::file_contents(dir / "run");
  const CommandResult evaluated = mltrain(config + " --eval-only --resume " + out);
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_NEAR(printed_val_loss(evaluated.output), printed_val_loss(checkpoint.output), 2e-6);
  EXPECT_EQ(testing::file_contents(dir / "run"), run_files);

  const std::string written = testing::read_text(dir / "export" / "config.json");
  const CommandResult again = mltrain(config + " --resume auto --export-hf " + out);
  EXPECT_EQ(again.exit_code, kExitUserError) << again.output;
  EXPECT_CONTAINS(again.output, "already exists and is not empty");
  EXPECT_EQ(lines(again.output), 1u) << again.output;
  EXPECT_EQ(testing::read_text(dir / "export" / "config.json"), written);

  // The config.json written must be the checkpoint's model, not one of the same tensor shapes.
  const CommandResult other = mltrain(config + " --resume auto --export-hf " +
                                      (dir / "other").string() + " --set model.rope_theta=500");
  EXPECT_EQ(other.exit_code, kExitUserError) << other.output;
  EXPECT_CONTAINS(other.output, "model.rope_theta: 500 in the config, 10000 in ");
  EXPECT_FALSE(std::filesystem::exists(dir / "other"));

  const CommandResult no_resume = mltrain(config + " --export-hf " + (dir / "x").string());
  EXPECT_EQ(no_resume.exit_code, kExitUserError);
  EXPECT_CONTAINS(no_resume.output, "--export-hf needs trained weights: add --resume auto");
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
}

// A run of 2 ranks at dist.zero_stage 3, where each rank holds its part of every weight, saves the
// same files as any run: its export gives in transformers the logits, and so the loss, of
// mltrain's model of that checkpoint.
TEST(HfCli, ExportsAStageThreeRunOfTwoRanks) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 4;
  config.optim.warmup_steps = 1;
  config.dist.zero_stage = 3;
  const auto path = dir / "run.yaml";
  testing::write_text(path, config_to_yaml(config));
  const CommandResult trained = testing::run_command(fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 {} 2 "
      "{}/mltrain {} 2>&1",
      MLTRAIN_MPIEXEC, MLTRAIN_BIN_DIR, path.string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_NE(trained.output.find("dist.zero_stage 3: its part of 2 ranks'"), std::string::npos)
      << trained.output;
  const std::string out = (dir / "export").string();
  const CommandResult exported = mltrain(path.string() + " --resume auto --export-hf " + out);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;

  const ExportedLogits logits = logits_of_export(dir, config.model, out);
  EXPECT_LE((logits.mltrain - logits.transformers).abs().max().item<double>(), 1e-4);
  const auto loss = [&](const at::Tensor& of) {
    return next_token_loss(of.narrow(1, 0, 15).contiguous(),
                           logits.tokens.narrow(1, 1, 15).contiguous())
        .item<double>();
  };
  EXPECT_NEAR(loss(logits.transformers), loss(logits.mltrain), 1e-5);
}

// Every validation window of tiny_run's stream (0, 7, 14, ... mod 31; 2000 tokens, seq_len 16),
// in order, as tokens and next tokens.
void write_validation_windows(const std::filesystem::path& path) {
  const int64_t seq_len = 16;
  const int64_t windows = (2000 - 1) / seq_len;
  const at::Tensor positions =
      at::arange(windows, at::kLong).unsqueeze(1) * seq_len + at::arange(seq_len + 1, at::kLong);
  const at::Tensor stream = positions * 7 % 31;
  save_safetensors(path, {{"tokens", stream.narrow(1, 0, seq_len).contiguous()},
                          {"targets", stream.narrow(1, 1, seq_len).contiguous()}});
}

TEST(HfCli, EvaluatesAndStartsFromAModelThatTransformersSaved) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 2;
  config.optim.warmup_steps = 1;
  const std::string run_yaml = (dir / "run.yaml").string();
  testing::write_text(run_yaml, config_to_yaml(config));
  testing::write_text(dir / "llama.json", R"({
      "vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
      "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": true})");
  write_validation_windows(dir / "val.safetensors");
  const std::string hf = (dir / "hf").string();
  run_reference(fmt::format("create {} none {} {}", (dir / "llama.json").string(), hf,
                            (dir / "val.safetensors").string()),
                dir / "out");
  const double reference_loss =
      load_safetensors(dir / "out" / "logits.safetensors").at("loss").item<double>();

  // The config's run directory is another run's: evaluating the Hugging Face directory leaves it
  // byte for byte as it was.
  std::filesystem::create_directories(config.train.run_dir);
  testing::write_text(std::filesystem::path(config.train.run_dir) / "metrics.jsonl",
                      "{\"step\": 1, \"loss\": 3.0}\n");
  const auto run_files = testing::file_contents(config.train.run_dir);
  const CommandResult evaluated = mltrain(run_yaml + " --eval-only --resume " + hf);
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_NEAR(printed_val_loss(evaluated.output), reference_loss, 1e-4);
  EXPECT_EQ(testing::file_contents(config.train.run_dir), run_files);

  const CommandResult mismatched =
      mltrain(run_yaml + " --eval-only --resume " + hf +
              " --set model.n_layers=3 --set model.d_ffn=128 --set model.max_seq_len=64");
  EXPECT_EQ(mismatched.exit_code, kExitUserError) << mismatched.output;
  const std::string config_json = hf + "/config.json";
  EXPECT_CONTAINS(mismatched.output, "model.n_layers: 3 in the config, 2 in " + config_json);
  EXPECT_CONTAINS(mismatched.output, "model.d_ffn: 128 in the config, 64 in " + config_json);
  EXPECT_EQ(mismatched.output.find("model.max_seq_len"), std::string::npos) << mismatched.output;

  const std::string fine_tune = run_yaml + " --set model.init_from=" + hf;
  const CommandResult trained = mltrain(fine_tune + " --set train.run_dir=" + (dir / "a").string());
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_CONTAINS(trained.output, "starting from the weights of " + hf + " (model.init_from)");
  const CommandResult resumed = mltrain(fine_tune + " --set train.run_dir=" + (dir / "a").string() +
                                        " --resume auto --set "
                                        "train.max_steps=3");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_CONTAINS(resumed.output, "is not used: a resumed run continues from its checkpoint");

  const CommandResult other =
      mltrain(fine_tune + " --set model.d_ffn=128 --set train.run_dir=" + (dir / "b").string());
  EXPECT_EQ(other.exit_code, kExitUserError) << other.output;
  EXPECT_CONTAINS(other.output, "model.d_ffn: 128 in the config, 64 in " + config_json);
  EXPECT_FALSE(std::filesystem::exists(dir / "b")) << "refused before the run directory is made";
  const CommandResult missing =
      mltrain(run_yaml + " --set model.init_from=" + (dir / "none").string() +
              " --set train.run_dir=" + (dir / "c").string());
  EXPECT_EQ(missing.exit_code, kExitUserError) << missing.output;
  EXPECT_CONTAINS(missing.output, "not a Hugging Face model directory");
  EXPECT_FALSE(std::filesystem::exists(dir / "c"));
}

// Fine-tuning as the README gives it: a Llama that transformers saved, with a SentencePiece
// tokenizer made as Llama's are, fine-tuned with model.init_from on a chat corpus prepared with
// that tokenizer (the llama2 template), exported, and loaded by transformers, whose loss over the
// validation targets that count (labels -100 elsewhere) is mltrain's.
TEST(HfCli, FineTunesAModelThatTransformersSavedOnChatsAndTransformersLoadsTheExport) {
  TemporaryDirectory dir;
  std::string chats;
  std::string text;
  for (int i = 0; i < 300; ++i) {
    const std::string question = fmt::format("What is {} plus {}?", i, i % 7);
    const std::string answer = fmt::format("It is {}.", i + i % 7);
    chats += nlohmann::json{{"messages",
                             {{{"role", "user"}, {"content", question}},
                              {{"role", "assistant"}, {"content", answer}}}}}
                 .dump() +
             "\n";
    text += question + " " + answer + "\n";
  }
  testing::write_text(dir / "chat.jsonl", chats);
  testing::write_text(dir / "text.txt", text);
  const CommandResult tokenizer = testing::run_command(
      fmt::format("{} {}/tests/reference/chat_render.py train-llama-like {} 300 {}", MLTRAIN_PYTHON,
                  MLTRAIN_SOURCE_DIR, (dir / "text.txt").string(), (dir / "llama").string()));
  ASSERT_EQ(tokenizer.exit_code, 0) << tokenizer.output;
  testing::write_text(dir / "llama.json", R"({
      "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": false})");
  save_safetensors(dir / "none.safetensors", {{"tokens", at::zeros({1, 4}, at::kLong)}});
  const std::string hf = (dir / "hf").string();
  run_reference(fmt::format("create {} none {} {}", (dir / "llama.json").string(), hf,
                            (dir / "none.safetensors").string()),
                dir / "created");
  std::filesystem::copy_file(dir / "llama.model", dir / "hf" / "tokenizer.model");

  const CommandResult prep = testing::run_tool(
      "mlprep",
      fmt::format("--input {} --format chat --chat-template llama2 --tokenizer {} "
                  "--val-fraction 0.2 --out {}",
                  (dir / "chat.jsonl").string(), hf + "/tokenizer.model", (dir / "chat").string()));
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  Config config = testing::tiny_run(dir.path());
  // The tiny run's shape, as llama.json gives it.
  config.model.vocab_size = 300;
  config.model.max_seq_len = 64;
  config.model.tie_word_embeddings = false;
  config.init_from = hf;
  config.data.train = (dir / "chat" / "train_*.bin").string();
  config.data.val = (dir / "chat" / "val_*.bin").string();
  config.data.tokenizer = hf + "/tokenizer.model";
  config.data.seq_len = 32;
  config.train.max_steps = 6;
  config.train.ckpt_every = 6;
  config.optim.warmup_steps = 2;
  const std::string run_yaml = (dir / "sft.yaml").string();
  testing::write_text(run_yaml, config_to_yaml(config));
  const CommandResult trained = mltrain(run_yaml);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_CONTAINS(trained.output, "loss masks: the loss is the mean over the targets");
  const std::string exported = (dir / "export").string();
  const CommandResult exporting = mltrain(run_yaml + " --resume auto --export-hf " + exported);
  ASSERT_EQ(exporting.exit_code, 0) << exporting.output;
  const CommandResult evaluated = mltrain(run_yaml + " --eval-only --resume " + exported);
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;

  // Every validation window, its targets -100 where the mask says they do not count.
  const TokenWindows windows(config.data.val, config.data.seq_len, config.model.vocab_size);
  std::vector<int64_t> all(static_cast<size_t>(windows.num_windows()));
  std::iota(all.begin(), all.end(), 0);
  const at::Tensor read = gather_windows(windows, all);
  const at::Tensor counts = gather_targets(windows, all);
  const at::Tensor targets = read.narrow(1, 1, config.data.seq_len).masked_fill(counts.eq(0), -100);
  save_safetensors(dir / "val.safetensors",
                   {{"tokens", read.narrow(1, 0, config.data.seq_len).contiguous()},
                    {"targets", targets.contiguous()}});
  run_reference(fmt::format("load {} {}", exported, (dir / "val.safetensors").string()),
                dir / "loaded");
  const double reference =
      load_safetensors(dir / "loaded" / "logits.safetensors").at("loss").item<double>();
  EXPECT_NEAR(printed_val_loss(evaluated.output), reference, 1e-4);
  // The fine-tuning moved the weights: the model transformers saved has another loss.
  run_reference(fmt::format("load {} {}", hf, (dir / "val.safetensors").string()), dir / "base");
  EXPECT_GT(
      std::abs(load_safetensors(dir / "base" / "logits.safetensors").at("loss").item<double>() -
               reference),
      1e-3);
}

}  // namespace
}  // namespace mltrain
