// data.document_masking end to end, as a user runs it: a masked run resumes bit for bit after
// kill -9, evaluation masks as training does, and bad settings are one line and exit 2. The tiny
// run's stream (0, 7, 14, ... mod 31) holds token 0 every 31 tokens: with data.eot_token 0, each
// 16-token window holds at most one document boundary.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/interop/safetensors.h"
#include "tests/launch/fault_support.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::mltrain;
using testing::mltrain_with_fault;
using testing::run_command;
using testing::TemporaryDirectory;
using testing::write_config;

const std::string kMasked = " --set data.document_masking=true --set data.eot_token=0";

bool same_weights(const std::filesystem::path& a, const std::filesystem::path& b) {
  const NamedTensors first = load_safetensors(a);
  const NamedTensors second = load_safetensors(b);
  for (const auto& [name, tensor] : first)
    if (!at::equal(tensor, second.at(name))) return false;
  return true;
}

TEST(DocumentMaskingRun, AMaskedRunKilledWhileSavingResumesBitwise) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 9) + " --set train.ckpt_every=3" + kMasked;
  const auto first = run_command(mltrain(config + " --set train.stop_at=3"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_CONTAINS(first.output,
                  "attention within documents: each begins at token 0 "
                  "(data.eot_token), its positions counted from 0");
  const auto killed =
      run_command(mltrain_with_fault("kill-during-checkpoint", config + " --resume auto"));
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  const auto resumed = run_command(mltrain(config + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto unbroken =
      run_command(mltrain(config + " --set train.run_dir=" + (dir / "unbroken").string()));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  const std::filesystem::path last = "checkpoints/step_00000009";
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_TRUE(same_weights(dir / "run" / last / file, dir / "unbroken" / last / file)) << file;
  }
  // The test can fail: the masking changes what the run learns.
  const auto unmasked = run_command(
      mltrain(write_config(dir, 9) + " --set train.run_dir=" + (dir / "unmasked").string()));
  ASSERT_EQ(unmasked.exit_code, 0) << unmasked.output;
  EXPECT_FALSE(same_weights(dir / "run" / last / "model.safetensors",
                            dir / "unmasked" / last / "model.safetensors"));
}

// The val loss of the last evaluation, from metrics.jsonl.
double last_val_loss(const std::filesystem::path& metrics) {
  double loss = -1.0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("val_loss")) loss = record["val_loss"].get<double>();
  }
  return loss;
}

TEST(DocumentMaskingRun, EvaluationMasksAsTrainingDoes) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 6) + " --set train.eval_every=6" + kMasked;
  const auto trained = run_command(mltrain(config));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const double in_training = last_val_loss(dir / "run" / "metrics.jsonl");
  ASSERT_GT(in_training, 0.0);

  const auto masked = run_command(mltrain(config + " --eval-only --resume auto"));
  ASSERT_EQ(masked.exit_code, 0) << masked.output;
  EXPECT_NEAR(last_val_loss(dir / "run" / "metrics.jsonl"), in_training, 1e-6);
  const auto unmasked =
      run_command(mltrain(config + " --eval-only --resume auto --set data.document_masking=false"));
  ASSERT_EQ(unmasked.exit_code, 0) << unmasked.output;
  EXPECT_GT(std::abs(last_val_loss(dir / "run" / "metrics.jsonl") - in_training), 1e-4);
}

TEST(DocumentMaskingRun, BadSettingsAreOneLineAndExitTwoAndHarmNothing) {
  TemporaryDirectory dir;
  const std::string config = write_config(dir, 6);
  ASSERT_EQ(run_command(mltrain(config)).exit_code, 0);
  const auto saved = testing::file_contents(dir / "run" / "checkpoints");
  const std::string metrics = testing::read_text(dir / "run" / "metrics.jsonl");
  const auto expect_refused = [&](const std::string& settings, const std::string& message) {
    const auto run =
        run_command(mltrain(config + " --resume auto --set train.max_steps=9" + settings));
    EXPECT_EQ(run.exit_code, kExitUserError) << run.output;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  };
  // The tiny run has no tokenizer to take the end-of-document token from.
  expect_refused(" --set data.document_masking=true",
                 "data.document_masking needs the end-of-document token: set data.tokenizer to "
                 "take it from, or data.eot_token to its id");
  expect_refused(
      " --set data.document_masking=true --set data.tokenizer=data/shards/tokenizer.model",
      "data.document_masking needs the end-of-document token: there is no tokenizer at "
      "data/shards/tokenizer.model (data.tokenizer) to take it from; set "
      "data.eot_token to its id");
  expect_refused(kMasked + " --set data.eot_token=32",
                 "data.eot_token (32) is not a token of model.vocab_size = 32");
  expect_refused(kMasked + " --set data.eot_token=-2", "data.eot_token");
  EXPECT_EQ(testing::file_contents(dir / "run" / "checkpoints"), saved);
  EXPECT_EQ(testing::read_text(dir / "run" / "metrics.jsonl"), metrics);
}

// Shards whose documents end in another token than the one named read each window as one
// document: the run says so, and trains.
TEST(DocumentMaskingRun, WarnsWhenTheFirstWindowsHoldNoEndOfDocumentToken) {
  TemporaryDirectory dir;
  const auto run =
      run_command(mltrain(write_config(dir, 6) + kMasked + " --set data.eot_token=31"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output,
                  "the first 16 training windows hold no token 31: each would be read as one "
                  "document; is it the token that ends the documents of these shards "
                  "(data.eot_token)?");
}

}  // namespace
}  // namespace mltrain
