// mltrain as a user runs it: what it prints and how it exits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/config/config.h"

namespace mltrain {
namespace {

using testing::CommandResult;

CommandResult mltrain(const std::string& arguments) {
  return testing::run_tool("mltrain", arguments);
}

const std::string kBase = MLTRAIN_SOURCE_DIR "/configs/base.yaml";

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// bench/step_profile.py's lines for a trace: each kind of work and its milliseconds and share.
struct ProfileRow {
  double ms = 0.0;
  double share = 0.0;
};
std::map<std::string, ProfileRow> step_profile(const std::filesystem::path& trace) {
  const CommandResult run = testing::run_command(fmt::format(
      "{} {}/bench/step_profile.py {}", MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR, trace.string()));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::map<std::string, ProfileRow> rows;
  std::istringstream lines(run.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t first_tab = line.find('\t');
    const size_t last_tab = line.rfind('\t');
    if (first_tab == std::string::npos || first_tab == last_tab) continue;
    rows[line.substr(0, first_tab)] = {std::stod(line.substr(first_tab + 1)),
                                       std::stod(line.substr(last_tab + 1))};
  }
  return rows;
}

std::map<std::string, double> step_profile_shares(const std::filesystem::path& trace) {
  std::map<std::string, double> shares;
  for (const auto& [kind, row] : step_profile(trace)) shares[kind] = row.share;
  return shares;
}

// train.profile_steps traces those steps: a Chrome trace that holds torch's operators and
// mltrain's phases, and a table of the costliest operations in the log. A run without it traces
// nothing, and a range that is no range is refused before anything runs.
TEST(MltrainCli, ProfileStepsTraceThoseStepsWithMltrainsPhases) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 4;
  config.optim.warmup_steps = 1;
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const std::string run_yaml = (dir / "run.yaml").string();

  const CommandResult traced = mltrain(run_yaml + " --set train.profile_steps=2-3");
  ASSERT_EQ(traced.exit_code, 0) << traced.output;
  const auto trace = dir / "run" / "profile" / "steps_2-3.json";
  EXPECT_CONTAINS(traced.output, "profile of steps 2 to 3: " + trace.string());
  EXPECT_CONTAINS(traced.output, "total ms     calls  operation");
  const nlohmann::json events = nlohmann::json::parse(testing::read_text(trace))["traceEvents"];
  std::set<std::string> names;
  for (const nlohmann::json& event : events) names.insert(event.value("name", ""));
  for (const char* phase : {"mltrain::data", "mltrain::forward", "mltrain::backward",
                            "mltrain::reduce", "mltrain::optimizer", "aten::mm"})
    EXPECT_TRUE(names.contains(phase)) << phase;

  // bench/step_profile.py reads it (StepProfile below checks its sums): the products and the
  // attention are there.
  const std::map<std::string, double> shares = step_profile_shares(trace);
  EXPECT_GT(shares.at("matrix products"), 0.05);
  EXPECT_GT(shares.at("attention"), 0.0);

  const CommandResult plain =
      mltrain(run_yaml + " --set train.run_dir=" + (dir / "plain").string());
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "plain" / "profile"));
  EXPECT_FALSE(std::filesystem::exists(dir / "plain" / "tensorboard"));
  EXPECT_EQ(plain.output.find("profile of steps"), std::string::npos);

  // Something else where the traces go stops the run before its first step, with the path named.
  std::filesystem::create_directories(dir / "blocked");
  testing::write_text(dir / "blocked" / "profile", "not a directory");
  const CommandResult blocked = mltrain(run_yaml +
                                        " --set train.profile_steps=2-3 --set "
                                        "train.run_dir=" +
                                        (dir / "blocked").string());
  EXPECT_EQ(blocked.exit_code, kExitUserError) << blocked.output;
  EXPECT_CONTAINS(blocked.output, (dir / "blocked" / "profile").string());
  EXPECT_EQ(blocked.output.find("step 1"), std::string::npos) << blocked.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "blocked" / "checkpoints"));

  for (const char* range : {"3", "3-2", "0-1", "2-x", "-2-3"}) {
    const CommandResult refused =
        mltrain(run_yaml + " --dry-run --set train.profile_steps=" + range);
    EXPECT_EQ(refused.exit_code, kExitUserError) << range;
    EXPECT_CONTAINS(refused.output,
                    "train.profile_steps must be FIRST-LAST with 1 <= FIRST <= LAST");
  }
}

// train.tensorboard: what TensorBoard's own reader finds in RUN_DIR/tensorboard/ is what
// metrics.jsonl says, as float32, at the same steps.
TEST(MltrainCli, TensorBoardScalarsAreTheMetrics) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 4;
  config.train.log_every = 1;
  config.train.eval_every = 2;
  config.train.tensorboard = true;
  config.optim.warmup_steps = 1;
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const CommandResult trained = mltrain((dir / "run.yaml").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const CommandResult read = testing::run_command(
      std::string(MLTRAIN_PYTHON) + " " MLTRAIN_SOURCE_DIR "/tests/reference/tensorboard_read.py " +
      (dir / "run" / "tensorboard").string());
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const nlohmann::json scalars = nlohmann::json::parse(read.output);

  // The metrics' value of `key` at each step that has it, as TensorBoard's float32.
  const auto metrics = [&](const std::string& key) {
    nlohmann::json points = nlohmann::json::array();
    std::istringstream lines(testing::read_text(dir / "run" / "metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.contains(key))
        points.push_back({record["step"], static_cast<double>(record[key].get<float>())});
    }
    return points;
  };
  EXPECT_EQ(scalars["train/loss"], metrics("loss"));
  EXPECT_EQ(scalars["train/lr"], metrics("lr"));
  EXPECT_EQ(scalars["train/grad_norm"], metrics("grad_norm"));
  EXPECT_EQ(scalars["train/tokens_per_s"], metrics("tokens_per_s"));
  EXPECT_EQ(scalars["val/loss"], metrics("val_loss"));
  EXPECT_EQ(scalars["val/loss"].size(), 2U);
  EXPECT_EQ(scalars["train/loss"].size(), 4U);
  EXPECT_TRUE(scalars.contains("train/gflops_per_s"));
  EXPECT_TRUE(scalars.contains("train/peak_memory_gb"));

  // A file where the event files go stops a run before its first step, with the path named.
  std::filesystem::create_directories(dir / "blocked");
  testing::write_text(dir / "blocked" / "tensorboard", "not a directory");
  const CommandResult blocked =
      mltrain((dir / "run.yaml").string() + " --set train.run_dir=" + (dir / "blocked").string());
  EXPECT_EQ(blocked.exit_code, kExitUserError) << blocked.output;
  EXPECT_CONTAINS(blocked.output, (dir / "blocked" / "tensorboard").string());
  EXPECT_EQ(blocked.output.find("step 1"), std::string::npos) << blocked.output;
}

TEST(MltrainCli, DryRunReportsTheModelAndExitsZero) {
  const CommandResult run = mltrain(kBase + " --dry-run --set train.device=cpu");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "layers.*.attn.wqkv");
  EXPECT_CONTAINS(run.output, "35,926,528");
  EXPECT_CONTAINS(run.output, "training FLOPs per token: 291.06 MFLOP");
  // base.yaml asks for bf16, which is taken as asked on any CPU (with a warning where it is slow).
  EXPECT_CONTAINS(run.output, "precision: bf16 autocast, fp32 weights (train.precision: bf16");
}

// base.yaml asks for CUDA: on a machine where CUDA cannot start, eight ranks must not quietly
// train on the CPU. One line, exit 2, and the run directory is not created.
TEST(MltrainCli, BaseConfigWithoutAGpuSaysHowToRunOnTheCpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  testing::TemporaryDirectory dir;
  const CommandResult run = mltrain(kBase + " --set train.run_dir=" + (dir / "run").string());
  EXPECT_EQ(run.exit_code, kExitUserError) << run.output;
  EXPECT_CONTAINS(run.output, "no CUDA device is visible");
  EXPECT_CONTAINS(run.output, "--set train.device=cpu");
  EXPECT_EQ(lines(run.output), 1u) << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

// Validation shards that training reads too are said (the loss would measure the fit to the
// training data), and the run goes on; separate shards are not.
TEST(MltrainCli, ValidationOnTrainingShardsIsSaid) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 2;
  config.optim.warmup_steps = 1;
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const std::string shared_text = "validation shards are training shards too";
  const CommandResult separate = mltrain((dir / "run.yaml").string());
  ASSERT_EQ(separate.exit_code, 0) << separate.output;
  EXPECT_EQ(separate.output.find(shared_text), std::string::npos);
  const CommandResult shared =
      mltrain((dir / "run.yaml").string() + " --set 'data.val=" + (dir / "*.bin").string() +
              "' --set train.run_dir=" + (dir / "shared").string());
  ASSERT_EQ(shared.exit_code, 0) << shared.output;
  EXPECT_CONTAINS(shared.output, "1 of the 2 " + shared_text);
}

TEST(MltrainCli, DumpConfigPrintsTheEffectiveConfig) {
  const CommandResult run = mltrain(kBase + " --dump-config --set model.n_layers=3");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "n_layers: 3\n");
  EXPECT_CONTAINS(run.output, "train: \"data/shards/train_*.bin\"");
}

TEST(MltrainCli, BadConfigKeyIsOneLineAndExitTwo) {
  const CommandResult run = mltrain(kBase + " --dry-run --set model.d_modle=3");
  EXPECT_EQ(run.exit_code, kExitUserError);
  EXPECT_CONTAINS(run.output, "unknown key model.d_modle (did you mean model.d_model?)");
  EXPECT_EQ(lines(run.output), 1u) << run.output;
}

TEST(MltrainCli, BadValuesOfTheMemoryKeysAreOneLineAndExitTwo) {
  for (const auto& [assignment, message] :
       {std::pair{"dist.zero_stage=4", "dist.zero_stage must be between 0 and 3, got 4"},
        std::pair{"train.activation_checkpointing=often",
                  "train.activation_checkpointing expects true or false, got \"often\""},
        std::pair{"train.check_memory=maybe",
                  "train.check_memory expects true or false, got \"maybe\""},
        std::pair{"train.cpu_memory=rss",
                  "train.cpu_memory must be one of resident, allocator, got \"rss\""},
        std::pair{"dist.shard_ranks=-1", "dist.shard_ranks must be at least 0, got -1"}}) {
    const CommandResult run = mltrain(kBase + " --dry-run --set " + assignment);
    EXPECT_EQ(run.exit_code, kExitUserError) << run.output;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(lines(run.output), 1u) << run.output;
  }
}

// dist.shard_ranks must divide the ranks, and names groups that share what a stage shards.
TEST(MltrainCli, ShardRanksThatDoNotDivideTheRanksOrShardNothingAreOneLineAndExitTwo) {
  for (const auto& [arguments, message] :
       {std::pair{
            "--ranks 4 --device-memory-gb 80 --set dist.zero_stage=3 --set dist.shard_ranks=3",
            "dist.shard_ranks 3 does not divide the 4 ranks"},
        std::pair{"--set dist.shard_ranks=2",
                  "dist.shard_ranks 2 groups the ranks that share what dist.zero_stage 1, 2 or 3 "
                  "shards, and dist.zero_stage is 0"}}) {
    const CommandResult run = mltrain(kBase + " --dry-run " + arguments);
    EXPECT_EQ(run.exit_code, kExitUserError) << run.output;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(lines(run.output), 1u) << run.output;
  }
  const CommandResult divides =
      mltrain(kBase +
              " --dry-run --ranks 4 --device-memory-gb 80 --set dist.zero_stage=3 "
              "--set dist.shard_ranks=2");
  EXPECT_CONTAINS(divides.output, "sharded within groups of dist.shard_ranks = 2");
  EXPECT_EQ(divides.exit_code, 0) << divides.output;
}

TEST(MltrainCli, InconsistentConfigExitsTwo) {
  const CommandResult run = mltrain(kBase + " --dry-run --set model.n_kv_heads=3");
  EXPECT_EQ(run.exit_code, kExitUserError);
  EXPECT_CONTAINS(run.output, "must be a multiple of model.n_kv_heads");
}

TEST(MltrainCli, BadArgumentsExitTwo) {
  const CommandResult unknown = mltrain(kBase + " --dryrun");
  EXPECT_EQ(unknown.exit_code, kExitUserError);
  EXPECT_CONTAINS(unknown.output, "unknown option --dryrun");
  const CommandResult none = mltrain("");
  EXPECT_EQ(none.exit_code, kExitUserError);
  EXPECT_CONTAINS(none.output, "no config file given");
  const CommandResult missing = mltrain("/nonexistent.yaml --dry-run");
  EXPECT_EQ(missing.exit_code, kExitUserError);
  EXPECT_CONTAINS(missing.output, "/nonexistent.yaml: cannot open the config file: no such file");
  const CommandResult dangling = mltrain(kBase + " --set");
  EXPECT_EQ(dangling.exit_code, kExitUserError);
  EXPECT_CONTAINS(dangling.output,
                  "--set: 1 required section.key=value missing (see mltrain --help)");
  const CommandResult second = mltrain(kBase + " other.yaml --dry-run");
  EXPECT_EQ(second.exit_code, kExitUserError);
  EXPECT_CONTAINS(second.output, "unexpected argument other.yaml: give one config file");
  const CommandResult eval_only = mltrain(kBase + " --eval-only");
  EXPECT_EQ(eval_only.exit_code, kExitUserError);
  EXPECT_CONTAINS(eval_only.output, "--eval-only needs trained weights: add --resume auto");
  const CommandResult export_hf = mltrain(kBase + " --export-hf out");
  EXPECT_EQ(export_hf.exit_code, kExitUserError);
  EXPECT_CONTAINS(export_hf.output, "--export-hf needs trained weights: add --resume auto");
  const CommandResult empty_export = mltrain(kBase + " --resume auto --export-hf ''");
  EXPECT_EQ(empty_export.exit_code, kExitUserError);
  EXPECT_CONTAINS(empty_export.output, "--export-hf: expected a directory, got an empty value");
  const CommandResult both = mltrain(kBase + " --resume auto --eval-only --export-hf out");
  EXPECT_EQ(both.exit_code, kExitUserError);
  EXPECT_CONTAINS(both.output, "--eval-only and --export-hf are two commands: give one");
  const CommandResult plan_only = mltrain(kBase + " --ranks 8 --device-memory-gb 80");
  EXPECT_EQ(plan_only.exit_code, kExitUserError);
  EXPECT_CONTAINS(plan_only.output, "--ranks and --device-memory-gb shape the plan of --dry-run");
  const CommandResult no_ranks = mltrain(kBase + " --dry-run --ranks 0");
  EXPECT_EQ(no_ranks.exit_code, kExitUserError);
  EXPECT_CONTAINS(no_ranks.output, "--ranks");
}

// --flight-report reads RUN_DIR/flight (tests/launch/rank_fault_test.cpp has the records of a real
// hang): what it cannot read is one line and exit 2, and it leaves the records as they were.
TEST(MltrainCli, FlightReportOfNoRecordsExitsTwo) {
  testing::TemporaryDirectory dir;
  const CommandResult missing = mltrain("--flight-report " + (dir / "nowhere").string());
  EXPECT_EQ(missing.exit_code, kExitUserError);
  EXPECT_CONTAINS(missing.output, "nowhere is not a directory: give the run's train.run_dir");
  std::filesystem::create_directories(dir / "flight.previous");
  const CommandResult none = mltrain("--flight-report " + dir.path().string());
  EXPECT_EQ(none.exit_code, kExitUserError);
  EXPECT_CONTAINS(none.output, "holds no flight records: the ranks of a multi-rank run");
  EXPECT_CONTAINS(none.output, "an earlier run's are in " + (dir / "flight.previous").string());
  std::filesystem::create_directories(dir / "flight");
  testing::write_text(dir / "flight" / "rank_0.json", "{\"rank\": 0,");
  const auto before = testing::file_contents(dir.path());
  const CommandResult broken = mltrain("--flight-report " + dir.path().string());
  EXPECT_EQ(broken.exit_code, kExitUserError);
  EXPECT_CONTAINS(broken.output, "rank_0.json is not a flight record");
  EXPECT_EQ(lines(broken.output), 1u) << broken.output;
  EXPECT_EQ(testing::file_contents(dir.path()), before);
  testing::write_text(dir / "flight" / "rank_3.json",
                      R"({"rank": 0, "world_size": 4, "reason": "", "failed_seq": null,
                          "written_us": 1, "collectives": []})");
  std::filesystem::remove(dir / "flight" / "rank_0.json");
  const CommandResult renamed = mltrain("--flight-report " + dir.path().string());
  EXPECT_EQ(renamed.exit_code, kExitUserError);
  EXPECT_CONTAINS(renamed.output, "rank_3.json holds the flight record of rank 0: it was renamed");
  for (const std::string& other :
       {kBase, std::string("--plot"), std::string("--set train.seed=1")}) {
    const CommandResult combined = mltrain(other + " --flight-report " + dir.path().string());
    EXPECT_EQ(combined.exit_code, kExitUserError) << other;
    EXPECT_CONTAINS(combined.output, "--flight-report RUN_DIR is a command of its own");
  }
}

// A model far beyond this machine's memory: one line that says so and what would fit, exit 2,
// before anything is allocated or written.
TEST(MltrainCli, ARunWhosePlanCannotFitStopsBeforeItAllocates) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.model.d_model = 8192;
  config.model.n_layers = 1000;
  config.model.n_q_heads = 64;
  config.model.head_dim = 128;
  config.model.d_ffn = 28672;
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  const CommandResult run = mltrain((dir / "run.yaml").string());
  EXPECT_EQ(run.exit_code, kExitUserError) << run.output;
  EXPECT_CONTAINS(run.output, "the memory plan needs ");
  EXPECT_CONTAINS(run.output, "nothing in the config makes it fit");
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "nothing may be written";
}

// A plan that does not fit is the dry run's failure, exit 2 as the run's, after the whole report;
// with train.check_memory=false the run would start, and so the dry run passes with a warning.
TEST(MltrainCli, DryRunPlansForGpusThisMachineNeedNotHave) {
  const CommandResult fits = mltrain(kBase + " --dry-run --ranks 8 --device-memory-gb 80");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_CONTAINS(fits.output, "of 80.00 GB per rank: fits");

  const CommandResult plan = mltrain(kBase + " --dry-run --ranks 8 --device-memory-gb 4");
  EXPECT_EQ(plan.exit_code, kExitUserError) << plan.output;
  EXPECT_CONTAINS(plan.output, "35926528 parameters, 8 ranks on CUDA, bf16 autocast");
  EXPECT_CONTAINS(plan.output, "of 4.00 GB per rank: does NOT fit");
  EXPECT_CONTAINS(plan.output, "planned for 8 GPUs of 4 GB, nothing was built");
  EXPECT_CONTAINS(plan.output,
                  "dry run: the memory plan needs 7.28 GB per rank but a rank has 4.00 GB: it "
                  "would fit with train.activation_checkpointing=true");
  EXPECT_CONTAINS(plan.output, "a run of this config would stop here");

  const CommandResult unchecked =
      mltrain(kBase + " --dry-run --ranks 8 --device-memory-gb 4 --set train.check_memory=false");
  EXPECT_EQ(unchecked.exit_code, 0) << unchecked.output;
  EXPECT_CONTAINS(unchecked.output, "train.check_memory=false starts the run all the same");
}

TEST(MltrainCli, UnknownFlagIsOneLineAndExitTwo) {
  const CommandResult run = mltrain(kBase + " --dry-run --lr 3");
  EXPECT_EQ(run.exit_code, kExitUserError);
  EXPECT_CONTAINS(run.output, "unknown option --lr (see mltrain --help)");
  EXPECT_EQ(lines(run.output), 1u) << run.output;
  // Without a config too, the unknown flag is what is reported: it is the likelier mistake.
  EXPECT_CONTAINS(mltrain("--dryrun").output, "unknown option --dryrun (see mltrain --help)");
}

// --set takes one value, so a config path after it is the config; --set=... is the same flag.
TEST(MltrainCli, SetOverridesInBothSpellings) {
  const CommandResult run =
      mltrain("--set model.n_layers=3 " + kBase + " --set=model.d_model=256 --dump-config");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "n_layers: 3\n");
  EXPECT_CONTAINS(run.output, "d_model: 256\n");
}

TEST(MltrainCli, HelpListsEveryFlagAndExitsZero) {
  const CommandResult run = mltrain("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_CONTAINS(run.output, "Usage: mltrain [OPTIONS] [CONFIG.yaml]");
  EXPECT_CONTAINS(run.output, "the config saved with the checkpoint of --resume");
  for (const char* flag : {"-h,--help", "--set section.key=value", "--resume auto|PATH",
                           "--eval-only", "--export-hf OUT_DIR", "--plot", "--dry-run", "--ranks N",
                           "--device-memory-gb GB", "--dump-config", "--flight-report RUN_DIR"}) {
    EXPECT_CONTAINS(run.output, flag);
  }
  EXPECT_CONTAINS(run.output, "mpirun -n 8 mltrain configs/base.yaml");
  EXPECT_CONTAINS(run.output, "exit codes: 0 success, 1 runtime failure, 2 bad input");
  EXPECT_EQ(mltrain("-h").output, run.output);
}

// The sums, on traces made by hand (times in microseconds). On the CPU each operator counts its
// own time: a phase of 100 holding a product of 50 (which holds an allocation of 5) and an add of
// 20 is 30 outside operators, 45 of products and 25 elementwise. On a GPU the kernels and copies
// count whole, and the gaps between them (10 and 20) are idle.
TEST(StepProfile, SumsOwnTimesOnTheCpuAndKernelsAndGapsOnAGpu) {
  testing::TemporaryDirectory dir;
  const auto event = [](const char* category, const char* name, double ts, double dur) {
    return nlohmann::json{{"ph", "X"}, {"cat", category}, {"name", name},
                          {"ts", ts},  {"dur", dur},      {"tid", 1}};
  };
  testing::write_text(
      dir / "cpu.json",
      nlohmann::json{{"traceEvents",
                      {event("user_annotation", "mltrain::forward", 0, 100),
                       event("cpu_op", "aten::mm", 10, 50), event("cpu_op", "aten::empty", 12, 5),
                       event("cpu_op", "aten::add", 70, 20)}}}
          .dump());
  const std::map<std::string, ProfileRow> cpu = step_profile(dir / "cpu.json");
  ASSERT_EQ(cpu.size(), 3u);
  EXPECT_NEAR(cpu.at("outside operators (mltrain's fused CPU kernels, host work)").ms, 0.030, 1e-9);
  EXPECT_NEAR(cpu.at("matrix products").ms, 0.045, 1e-9);
  EXPECT_NEAR(cpu.at("elementwise").ms, 0.025, 1e-9);
  EXPECT_NEAR(cpu.at("matrix products").share, 0.45, 1e-4);

  testing::write_text(
      dir / "gpu.json",
      nlohmann::json{{"traceEvents",
                      {event("cpu_op", "aten::mm", 0, 500),
                       event("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 0, 40),
                       event("kernel", "flash_fwd_kernel", 50, 20),
                       event("kernel", "void at::native::vectorized_elementwise_kernel<4>", 70, 10),
                       event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 100, 10)}}}
          .dump());
  const std::map<std::string, ProfileRow> gpu = step_profile(dir / "gpu.json");
  ASSERT_EQ(gpu.size(), 5u);
  EXPECT_NEAR(gpu.at("matrix products").ms, 0.040, 1e-9);
  EXPECT_NEAR(gpu.at("attention").ms, 0.020, 1e-9);
  EXPECT_NEAR(gpu.at("elementwise").ms, 0.010, 1e-9);
  EXPECT_NEAR(gpu.at("copies and casts").ms, 0.010, 1e-9);
  EXPECT_NEAR(gpu.at("idle (no kernel running)").ms, 0.030, 1e-9);
  EXPECT_NEAR(gpu.at("idle (no kernel running)").share, 0.030 / 0.110, 1e-4);
}

}  // namespace
}  // namespace mltrain
