// Bad input as a careless user or an attacker gives it, met as a user meets it: one clear line
// that names the file or the key, exit code 2, and nothing already saved harmed. Each case is one
// that once ended otherwise: in a hang, a crash, a stack trace, exit code 1 or a silent mistake.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/launch/trained_run.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::TemporaryDirectory;

// Every command is given a deadline: a case that once hung must fail, not stall the suite.
CommandResult run(const std::string& executable, const std::string& arguments) {
  return testing::run_command("timeout 60 " + std::string(MLTRAIN_BIN_DIR) + "/" + executable +
                              " " + arguments);
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The tiny run's config file in `dir`, with `change` made to it.
std::string tiny_config(
    const TemporaryDirectory& dir, const std::function<void(Config&)>& change = [](Config&) {}) {
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 4;
  config.optim.warmup_steps = 1;
  change(config);
  const auto path = dir / "run.yaml";
  testing::write_text(path, config_to_yaml(config));
  return path.string();
}

void expect_user_error(const CommandResult& result, const std::string& message) {
  EXPECT_EQ(result.exit_code, kExitUserError) << result.output;
  EXPECT_CONTAINS(result.output, message);
  EXPECT_EQ(result.output.find("frame #"), std::string::npos) << "a stack trace: " << result.output;
}

// A named pipe blocks whoever opens it to read until a writer comes; a directory or a device is no
// file to read either. Each is refused at once, wherever a path is given.
TEST(BadInput, PathsThatAreNoFileToReadAreRefusedAtOnce) {
  TemporaryDirectory dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0644), 0);
  std::filesystem::create_directory(dir / "shards");
  ASSERT_EQ(::mkfifo((dir / "shards" / "train_000000.bin").c_str(), 0644), 0);
  std::filesystem::create_directory(dir / "folder.bin");

  const CommandResult config_pipe = run("mltrain", (dir / "pipe").string() + " --dry-run");
  expect_user_error(config_pipe,
                    "pipe: the config file is a named pipe (FIFO), not a file to read");
  EXPECT_EQ(lines(config_pipe.output), 1u) << config_pipe.output;
  const CommandResult config_folder = run("mltrain", dir.path().string() + " --dry-run");
  expect_user_error(config_folder, dir.path().string() + ": the config file is a directory");
  expect_user_error(run("mltrain", "/dev/zero --dry-run"),
                    "/dev/zero: the config file is a character device");

  const std::string train_pipe =
      tiny_config(dir, [&](Config& config) { config.data.train = (dir / "pipe").string(); });
  expect_user_error(run("mltrain", train_pipe), "pipe: the token shard is a named pipe");
  const std::string glob_pipe = tiny_config(
      dir, [&](Config& config) { config.data.train = (dir / "shards" / "*.bin").string(); });
  expect_user_error(run("mltrain", glob_pipe), "train_000000.bin: the token shard is a named pipe");
  const std::string folder =
      tiny_config(dir, [&](Config& config) { config.data.val = (dir / "folder.bin").string(); });
  expect_user_error(run("mltrain", folder), "folder.bin: the token shard is a directory");
  const std::string tokenizer_pipe =
      tiny_config(dir, [&](Config& config) { config.data.tokenizer = (dir / "pipe").string(); });
  expect_user_error(run("mltrain", tokenizer_pipe), "pipe: the tokenizer model is a named pipe");
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "a refused run leaves nothing";

  testing::write_text(dir / "text.txt", "one document\n\nand another\n");
  expect_user_error(run("mlprep", "--input " + (dir / "text.txt").string() + " --tokenizer " +
                                      (dir / "pipe").string() + " --out " + (dir / "out").string()),
                    "pipe: the tokenizer model is a named pipe");
  // A pipe is an input mlprep takes (with a tokenizer given); a device, one endless line, is not.
  expect_user_error(run("mlprep", "--input /dev/zero --tokenizer " + (dir / "pipe").string() +
                                      " --out " + (dir / "out").string()),
                    "/dev/zero: a device or a socket, not a corpus");
}

// What a run writes in its directory, found to be something else: named, exit 2, not a raw
// filesystem error.
TEST(BadInput, ARunDirectoryHoldingOtherThingsWhereItWritesIsNamed) {
  TemporaryDirectory dir;
  const std::string config = tiny_config(dir);
  std::filesystem::create_directories(dir / "run");
  testing::write_text(dir / "run" / "checkpoints", "a file");
  expect_user_error(run("mltrain", config + " --resume auto"),
                    (dir / "run" / "checkpoints").string() +
                        ": not a directory, where the run keeps its checkpoints");
  std::filesystem::remove(dir / "run" / "checkpoints");
  // Found before the first step, not at the first save after it.
  std::filesystem::create_directories(dir / "run" / "checkpoints" / "latest");
  const CommandResult latest = run("mltrain", config + " --resume auto");
  expect_user_error(latest, (dir / "run" / "checkpoints" / "latest").string());
  EXPECT_EQ(latest.output.find("step 1/"), std::string::npos) << latest.output;
  std::filesystem::remove(dir / "run" / "checkpoints" / "latest");
  ASSERT_EQ(::mkfifo((dir / "run" / "metrics.jsonl").c_str(), 0644), 0);
  expect_user_error(run("mltrain", config),
                    (dir / "run" / "metrics.jsonl").string() + ": not a regular file");
  std::filesystem::remove(dir / "run" / "metrics.jsonl");
  std::filesystem::create_directory(dir / "run" / "metrics.jsonl");
  expect_user_error(run("mltrain", config), "Is a directory");
  testing::write_text(dir / "file", "");
  const std::string file_run_dir =
      tiny_config(dir, [&](Config& config) { config.train.run_dir = (dir / "file").string(); });
  expect_user_error(run("mltrain", file_run_dir), "file is a file, not a directory");
}

// A safetensors shape whose element count overflows 64 bits once passed the size check, and
// LibTorch then threw with a stack trace; through --eval-only and through model.init_from. Here
// [2^60 + 2560, 4] of F32 "needs" 40960 bytes modulo 2^64, which the file holds: enough for the
// tiny model's parameters, so that the file is read.
TEST(BadInput, ASafetensorsShapeThatOverflowsIsOneLine) {
  TemporaryDirectory dir;
  const std::string header =
      R"({"model.embed_tokens.weight": {"dtype": "F32", "shape": [1152921504606849536, 4], )"
      R"("data_offsets": [0, 40960]}})";
  const uint64_t length = header.size();
  const std::string bytes = std::string(reinterpret_cast<const char*>(&length), sizeof(length)) +
                            header + std::string(40960, '\0');
  std::filesystem::create_directory(dir / "hf");
  testing::write_text(dir / "hf" / "model.safetensors", bytes);
  const std::string message =
      "tensor 'model.embed_tokens.weight': its shape has more elements than 64-bit sizes count";
  const std::string config = tiny_config(dir);
  const CommandResult evaluated = run(
      "mltrain", config + " --eval-only --resume " + (dir / "hf" / "model.safetensors").string());
  expect_user_error(evaluated, message);

  const nlohmann::json hf_config = {{"model_type", "llama"},
                                    {"vocab_size", 32},
                                    {"hidden_size", 32},
                                    {"intermediate_size", 64},
                                    {"num_hidden_layers", 2},
                                    {"num_attention_heads", 4},
                                    {"num_key_value_heads", 2},
                                    {"head_dim", 8},
                                    {"max_position_embeddings", 32},
                                    {"rms_norm_eps", 1e-6},
                                    {"tie_word_embeddings", true}};
  testing::write_text(dir / "hf" / "config.json", hf_config.dump());
  const std::string init_from =
      tiny_config(dir, [&](Config& c) { c.init_from = (dir / "hf").string(); });
  expect_user_error(run("mltrain", init_from), message);
}

// Sizes whose products overflow once printed negative parameter counts or threw from the
// allocator; numbers on the command line that are not finite, or absurd, were taken.
TEST(BadInput, SizesBeyondCountingAndAbsurdNumbersAreOneLine) {
  const std::string base =
      MLTRAIN_SOURCE_DIR "/configs/base.yaml --dry-run --set train.device=cpu ";
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"--set model.d_model=1000000000 --set model.head_dim=1000000000 "
            "--set model.n_q_heads=1 --set model.n_kv_heads=1",
            "parameters, more than the 2.81e+14 mltrain can train"},
           {"--set data.micro_batch=4611686018427387904 --set data.grad_accum=4",
            "tokens per step and rank, more than mltrain takes"},
           {"--device-memory-gb 1e308",
            "--device-memory-gb: expected a number of GB above 0 and at most 1000000, got "
            "\"1e308\""},
           {"--device-memory-gb nan", "expected a number of GB above 0"},
           {"--device-memory-gb -3", "expected a number of GB above 0"},
           {"--ranks 0", "--ranks: expected an integer from 1 to 1048576, got \"0\""},
           {"--ranks 99999999999999999999", "--ranks: expected an integer from 1 to 1048576"}}) {
    const CommandResult result = run("mltrain", base + arguments);
    expect_user_error(result, message);
    EXPECT_EQ(lines(result.output), 1u) << result.output;
    EXPECT_LT(result.output.size(), 400u) << result.output;
  }
}

// A model whose weights alone exceed the machine is planned, not built, and the dry run exits as
// the run would stop: 2.
TEST(BadInput, ADryRunOfAModelTooLargeForTheMachineDoesNotBuildIt) {
  const CommandResult result = run("mltrain", MLTRAIN_SOURCE_DIR
                                   "/configs/base.yaml --dry-run --set train.device=cpu --set "
                                   "model.n_layers=100000");
  EXPECT_EQ(result.exit_code, kExitUserError) << result.output;
  EXPECT_CONTAINS(result.output, "the model is not built: its weights alone take 1128.");
  EXPECT_CONTAINS(result.output, "dry run: the config is valid; nothing was trained");
  EXPECT_CONTAINS(result.output, "a run of this config would stop here");
}

// Weights are read into a model built from a config: one that describes a far larger model than
// the weights could be is refused before it is built, not with the allocator's error.
TEST(BadInput, AConfigOfAModelFarLargerThanItsWeightsIsRefusedBeforeBuilding) {
  TemporaryDirectory dir;
  const std::string config = testing::trained_run(dir);
  const CommandResult result =
      run("mltrain", config + " --eval-only --resume auto --set model.n_layers=100000000");
  expect_user_error(result, "the config's model.* keys: a model of 928000001056 parameters");
  EXPECT_CONTAINS(result.output, "fewer than they take even in bf16");
}

TEST(BadInput, AKeyGivenTwiceIsOneLineNamingBothLines) {
  TemporaryDirectory dir;
  testing::write_text(dir / "twice.yaml",
                      "model:\n  d_model: 256\ntrain:\n  device: cpu\nmodel:\n  n_layers: 2\n");
  const CommandResult result = run("mltrain", (dir / "twice.yaml").string() + " --dry-run");
  expect_user_error(result, "twice.yaml:5: section model is given twice, here and at line 1");
  EXPECT_EQ(lines(result.output), 1u) << result.output;
}

// `latest` may be made to point at any file: it is named, and what it holds is not shown.
TEST(BadInput, ALatestThatNamesNoCheckpointIsNamedNotQuoted) {
  TemporaryDirectory dir;
  const std::string config = testing::trained_run(dir);
  const auto latest = dir / "run" / "checkpoints" / "latest";
  testing::write_text(dir / "secret.txt", "password=hunter2\n");
  std::filesystem::remove(latest);
  std::filesystem::create_symlink(dir / "secret.txt", latest);
  for (const char* tool : {"mltrain", "mlgen"}) {
    const CommandResult result = std::string(tool) == "mltrain"
                                     ? run(tool, config + " --eval-only --resume auto")
                                     : run(tool, (dir / "run").string() + " --prompt x");
    expect_user_error(result, latest.string() + ": does not name a checkpoint");
    EXPECT_EQ(result.output.find("hunter2"), std::string::npos) << result.output;
  }
}

TEST(BadInput, AStateOfTheWrongTypeNamesTheFileAndTheKey) {
  TemporaryDirectory dir;
  const std::string config = testing::trained_run(dir);
  const auto state_path = dir / "run" / "checkpoints" / "step_00000004" / "state.json";
  auto state = nlohmann::json::parse(testing::read_text(state_path));
  state["rng"]["cpu"] = "zz";
  testing::write_text(state_path, state.dump());
  const CommandResult result = run("mltrain", config + " --resume auto --set train.max_steps=6");
  expect_user_error(result, state_path.string() +
                                ": \"rng.cpu\" must be a string of lowercase "
                                "hexadecimal digits");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000006"));
}

// A line a crash cut short (or any other bad one) is passed over, with the file and line named;
// a run directory without metrics is nothing to plot.
TEST(BadInput, PlotPassesOverBadLinesAndNeedsMetrics) {
  if (testing::run_command("command -v gnuplot").exit_code != 0)
    GTEST_SKIP() << "no gnuplot (launch/setup.sh installs it)";
  TemporaryDirectory dir;
  const std::string config = testing::trained_run(dir);
  const auto metrics = dir / "run" / "metrics.jsonl";
  std::filesystem::remove(dir / "run" / "loss.png");
  // An --eval-only's record, which has no step, is no bad line.
  ASSERT_EQ(run("mltrain", config + " --eval-only --resume auto").exit_code, 0);
  testing::write_text(metrics, testing::read_text(metrics) + "{\"step\": \"x\", \"loss\": 1}\n" +
                                   "not json\n" + "{\"event\": 5}\n" +
                                   "{\"step\": 5, \"loss\": \"high\"}\n{\"ste");
  const CommandResult plotted = run("mltrain", config + " --plot");
  EXPECT_EQ(plotted.exit_code, 0) << plotted.output;
  EXPECT_CONTAINS(plotted.output, metrics.string() +
                                      ": passed over 4 line(s) that are not metrics "
                                      "records, the first at line");
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "loss.png"));

  // Metrics without a finite loss (a run that only diverged) are nothing to plot either, and the
  // picture already drawn stays.
  const std::string picture = testing::read_text(dir / "run" / "loss.png");
  testing::write_text(metrics,
                      "{\"event\": \"start\", \"step\": 0}\n{\"step\": 1, \"loss\": null}\n");
  expect_user_error(run("mltrain", config + " --plot"),
                    metrics.string() + ": no finite losses to plot");
  EXPECT_EQ(testing::read_text(dir / "run" / "loss.png"), picture);

  std::filesystem::remove(metrics);
  expect_user_error(run("mltrain", config + " --plot"), metrics.string() + ": no metrics to plot");
}

// Names and paths that are not UTF-8 go nowhere that holds Unicode text only (JSON and YAML). A
// data.sources name of other bytes is refused at once, naming its key (it once passed, and then
// every evaluation record and checkpoint save failed with nlohmann's raw type_error 316); so is a
// relative data path from a working directory whose name is not UTF-8, which the run would save
// absolute. A run directory renamed to such a name is still evaluated, and its record written,
// with U+FFFD for each bad byte (it was once left out, with the raw text as a warning).
TEST(BadInput, TextThatIsNotUtf8IsRefusedWhereItEntersOrWrittenReplaced) {
  TemporaryDirectory dir;
  const std::string config = tiny_config(dir);
  const std::string train = (dir / "train_*.bin").string();
  const std::string val = (dir / "val_*.bin").string();
  const CommandResult named =
      run("mltrain", config + " --set 'data.sources=[{name: \"web\xFF\", train: \"" + train +
                         "\", val: \"" + val + "\"}]'");
  expect_user_error(named, "data.sources entry 1: name is not valid UTF-8 (\"web\\xFF\", byte 4)");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints"));

  const std::filesystem::path foreign = dir / "d\xE9j\xE0";
  std::filesystem::create_directories(foreign);
  std::filesystem::copy_file(dir / "train_000000.bin", foreign / "train_000000.bin");
  std::filesystem::copy_file(dir / "val_000000.bin", foreign / "val_000000.bin");
  const CommandResult relative = testing::run_tool_in(
      foreign, "mltrain",
      config + " --set data.train=train_000000.bin --set data.val=val_000000.bin");
  expect_user_error(relative, "data.train is relative to the working directory " +
                                  (dir / "d\\xE9j\\xE0").string() +
                                  ", whose name is not valid UTF-8");

  ASSERT_EQ(run("mltrain", config).exit_code, 0);
  const std::filesystem::path renamed = dir / "run\xFF";
  std::filesystem::rename(dir / "run", renamed);
  const CommandResult evaluated = run("mltrain", "--eval-only --resume " + renamed.string());
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_EQ(evaluated.output.find("not recorded"), std::string::npos) << evaluated.output;
  const std::string metrics = testing::read_text(renamed / "metrics.jsonl");
  const size_t record = metrics.rfind("{\"event\":\"eval_only\"");
  ASSERT_NE(record, std::string::npos) << metrics;
  const nlohmann::json parsed = nlohmann::json::parse(metrics.substr(record));
  EXPECT_EQ(
      parsed["weights"],
      (dir / "run\xEF\xBF\xBD" / "checkpoints" / "step_00000004" / "model.safetensors").string());
}

}  // namespace
}  // namespace mltrain
