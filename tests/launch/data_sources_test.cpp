// data.sources as a user runs it: three corpora blended by weight, read alike on 1, 2 and 3 ranks,
// resumed with other weights without a window read twice or skipped, resumed bitwise, validated
// per source; and each kind of bad source refused in one line. The windows read come from
// mltrain_faults' print-windows lines.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "data/blended_sampler.h"
#include "data/token_windows.h"
#include "model/interop/safetensors.h"
#include "tests/launch/fault_support.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::run_command;
using testing::TemporaryDirectory;

const std::vector<std::pair<std::string, size_t>> kCorpora = {
    {"web", 20000}, {"code", 8000}, {"books", 3000}};

// The tiny run on three corpora of learnable streams, with `weights`, a step of 12 windows (2
// micro-steps of 6 on one rank), every step logged.
Config blend_run(const TemporaryDirectory& dir, const std::vector<double>& weights) {
  Config config = testing::tiny_run(dir.path());
  config.data.train = DataConfig{}.train;
  config.data.val = DataConfig{}.val;
  config.data.micro_batch = 6;
  config.optim.schedule = "constant";
  config.train.max_steps = 12;
  config.train.log_every = 1;
  config.train.eval_every = 1000;
  config.train.eval_batches = 4;
  for (size_t s = 0; s < kCorpora.size(); ++s) {
    const auto& [name, tokens] = kCorpora[s];
    const std::filesystem::path corpus = dir / name;
    if (!std::filesystem::exists(corpus)) {
      std::filesystem::create_directories(corpus);
      testing::write_learnable_stream(corpus / "train_000000.bin", tokens);
      testing::write_learnable_stream(corpus / "val_000000.bin", 1000 + 500 * s);
    }
    config.sources.push_back(
        {name, (corpus / "train_*.bin").string(), (corpus / "val_*.bin").string(), weights[s]});
  }
  return config;
}

std::string write_config(const TemporaryDirectory& dir, const Config& config,
                         const std::string& file = "run.yaml") {
  testing::write_text(dir / file, config_to_yaml(config));
  return (dir / file).string();
}

// Every window each step read, in the order of the step's samples: micro-step m of rank r reads
// its slice m x ranks + r (a rank prints its micro-batches in order).
std::map<int64_t, std::vector<int64_t>> windows_by_step(const std::string& output) {
  std::map<int64_t, std::map<int, std::vector<std::vector<int64_t>>>> batches;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    int64_t step = 0;
    int rank = 0;
    char text[4096] = {};
    if (std::sscanf(line.c_str(), "windows %ld %d: %4095s", &step, &rank, text) != 3) continue;
    std::vector<int64_t> windows;
    std::istringstream ids(text);
    for (std::string id; std::getline(ids, id, ',');) windows.push_back(std::stoll(id));
    batches[step][rank].push_back(std::move(windows));
  }
  std::map<int64_t, std::vector<int64_t>> steps;
  for (const auto& [step, ranks] : batches) {
    for (size_t micro = 0; micro < ranks.begin()->second.size(); ++micro)
      for (const auto& [rank, micro_batches] : ranks)
        steps[step].insert(steps[step].end(), micro_batches.at(micro).begin(),
                           micro_batches.at(micro).end());
  }
  return steps;
}

// Each source's windows (in its own numbering) that a run listing `names` read, in order.
std::map<std::string, std::vector<int64_t>> windows_by_source(
    const std::string& output, const TemporaryDirectory& dir,
    const std::vector<std::string>& names) {
  std::vector<int64_t> first_window = {0};
  for (const std::string& name : names)
    first_window.push_back(
        first_window.back() +
        TokenWindows((dir / name / "train_*.bin").string(), 16, 32).num_windows());
  std::map<std::string, std::vector<int64_t>> read;
  for (const auto& [step, windows] : windows_by_step(output)) {
    for (const int64_t id : windows) {
      const auto s =
          static_cast<size_t>(std::upper_bound(first_window.begin(), first_window.end(), id) -
                              first_window.begin() - 1);
      read[names[s]].push_back(id - first_window[s]);
    }
  }
  return read;
}

// The first `count` windows of `name`'s permutation under the default data.seed.
std::vector<int64_t> permutation_prefix(const TemporaryDirectory& dir, const std::string& name,
                                        size_t count) {
  Sampler permutation(TokenWindows((dir / name / "train_*.bin").string(), 16, 32).num_windows(),
                      source_seed(1337, name));
  std::vector<int64_t> windows;
  for (size_t k = 0; k < count; ++k)
    windows.push_back(permutation.window_of_sample(static_cast<int64_t>(k)));
  return windows;
}

TEST(DataSources, OneTwoAndThreeRanksReadTheSameSamples) {
  TemporaryDirectory dir;
  const Config config = blend_run(dir, {0.7, 0.2, 0.1});
  const std::string file = write_config(dir, config);
  const auto one = run_command(testing::mltrain_with_fault("print-windows", file));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_CONTAINS(one.output,
                  "source books: 3000 tokens, 187 windows, weight 0.1 (10.0% of the samples)");
  const auto expected = windows_by_step(one.output);
  ASSERT_EQ(expected.size(), 12u);
  for (const int ranks : {2, 3}) {
    const auto run = run_command(testing::mpirun_with_fault(
        ranks, "print-windows",
        fmt::format("{} --set data.micro_batch={} --set train.run_dir={}", file, 6 / ranks,
                    (dir / fmt::format("ranks_{}", ranks)).string())));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(windows_by_step(run.output), expected) << ranks << " ranks";
  }
}

// Stopped at step 6 with weights 0.7/0.2/0.1 and resumed with 0.1/0.1/0.8: within each source the
// windows read across both runs are its permutation's first ones, in order, none twice, none
// skipped; and from step 7 on the new shares hold.
TEST(DataSources, NewWeightsAtAResumeReadNoWindowTwiceAndSkipNone) {
  TemporaryDirectory dir;
  const std::string first = write_config(dir, blend_run(dir, {0.7, 0.2, 0.1}), "first.yaml");
  const std::string second = write_config(dir, blend_run(dir, {0.1, 0.1, 0.8}), "second.yaml");
  const auto before = run_command(testing::mltrain_with_fault(
      "print-windows", first + " --set train.stop_at=6 --set train.ckpt_every=3"));
  ASSERT_EQ(before.exit_code, 0) << before.output;
  const auto after =
      run_command(testing::mltrain_with_fault("print-windows", second + " --resume auto"));
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_CONTAINS(after.output, "the data sources or their weights differ from the checkpoint's");

  const std::vector<std::string> names = {"web", "code", "books"};
  const auto read_before = windows_by_source(before.output, dir, names);
  const auto read_after = windows_by_source(after.output, dir, names);
  // Within a step the ranks' slices come in sample order, but a source's windows are its
  // permutation's in the order of its own samples: compared as sets per source.
  for (const std::string& name : names) {
    std::vector<int64_t> read =
        read_before.count(name) ? read_before.at(name) : std::vector<int64_t>{};
    const std::vector<int64_t>& later = read_after.at(name);
    read.insert(read.end(), later.begin(), later.end());
    std::vector<int64_t> expected = permutation_prefix(dir, name, read.size());
    std::sort(read.begin(), read.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(read, expected) << "source " << name;
  }
  const std::vector<double> shares = {0.1, 0.1, 0.8};
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_LE(std::abs(static_cast<double>(read_after.at(names[s]).size()) - shares[s] * 72), 1.0)
        << names[s];
  }
}

// A source left out of a run and listed again goes on from where it stopped: code, read with web
// and books to step 4, left out to step 8, and read again to step 12, never reads a window twice
// and skips none.
TEST(DataSources, ASourceLeftOutAndListedAgainGoesOnWhereItStopped) {
  TemporaryDirectory dir;
  const Config all = blend_run(dir, {0.5, 0.3, 0.2});
  Config without_code = all;
  without_code.sources.erase(without_code.sources.begin() + 1);
  const std::string all_file = write_config(dir, all, "all.yaml");
  const std::string without_file = write_config(dir, without_code, "without.yaml");
  std::vector<std::string> outputs;
  for (const auto& [file, more] :
       {std::pair{all_file, std::string(" --set train.stop_at=4 --set train.ckpt_every=4")},
        {without_file, " --resume auto --set train.stop_at=8 --set train.ckpt_every=4"},
        {all_file, " --resume auto"}}) {
    const auto run = run_command(testing::mltrain_with_fault("print-windows", file + more));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    outputs.push_back(run.output);
  }
  std::vector<int64_t> code;
  for (const auto& [output, names] :
       {std::pair{outputs[0], std::vector<std::string>{"web", "code", "books"}},
        {outputs[1], {"web", "books"}},
        {outputs[2], {"web", "code", "books"}}}) {
    const auto read = windows_by_source(output, dir, names);
    if (read.count("code")) code.insert(code.end(), read.at("code").begin(), read.at("code").end());
  }
  EXPECT_GT(code.size(), 20u);
  std::vector<int64_t> expected = permutation_prefix(dir, "code", code.size());
  std::sort(code.begin(), code.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(code, expected);
}

TEST(DataSources, AResumedBlendEndsBitwiseAsTheUnbrokenOne) {
  TemporaryDirectory dir;
  const std::string file = write_config(dir, blend_run(dir, {0.7, 0.2, 0.1}));
  ASSERT_EQ(run_command(testing::mltrain(file + " --set train.stop_at=5")).exit_code, 0);
  const auto resumed = run_command(testing::mltrain(file + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto unbroken =
      run_command(testing::mltrain(file + " --set train.run_dir=" + (dir / "unbroken").string()));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.output;
  const std::filesystem::path last = std::filesystem::path("checkpoints") / "step_00000012";
  const NamedTensors a = load_safetensors(dir / "run" / last / "model.safetensors");
  const NamedTensors b = load_safetensors(dir / "unbroken" / last / "model.safetensors");
  for (const auto& [name, tensor] : a) EXPECT_TRUE(at::equal(tensor, b.at(name))) << name;
  // New weights at step 4, then a second resume at step 8 with the same new weights (its blend
  // starts at step 4's samples) end as one resume at step 4 does.
  const std::string changed = write_config(dir, blend_run(dir, {0.2, 0.3, 0.5}), "changed.yaml");
  for (const std::string run_dir : {"once", "twice"}) {
    const std::string here = " --set train.run_dir=" + (dir / run_dir).string();
    ASSERT_EQ(run_command(testing::mltrain(file + here + " --set train.stop_at=4")).exit_code, 0);
    if (run_dir == "twice") {
      ASSERT_EQ(
          run_command(testing::mltrain(changed + here + " --resume auto --set train.stop_at=8"))
              .exit_code,
          0);
    }
    const auto run = run_command(testing::mltrain(changed + here + " --resume auto"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  const NamedTensors once = load_safetensors(dir / "once" / last / "model.safetensors");
  const NamedTensors twice = load_safetensors(dir / "twice" / last / "model.safetensors");
  for (const auto& [name, tensor] : once) EXPECT_TRUE(at::equal(tensor, twice.at(name))) << name;

  const auto state = nlohmann::json::parse(testing::read_text(dir / "run" / last / "state.json"));
  int64_t consumed = 0;
  for (const auto& source : state["blend"]["sources"])
    consumed += source["consumed"].get<int64_t>();
  EXPECT_EQ(consumed, 12 * 12) << "every sample is some source's";
}

// Validation loss per source, and their mean weighted by the sources' shares, in the log and in
// metrics.jsonl, in training and in --eval-only.
TEST(DataSources, ValidationReportsEverySourceAndTheirWeightedMean) {
  TemporaryDirectory dir;
  const std::string file = write_config(dir, blend_run(dir, {0.7, 0.2, 0.1}));
  const auto run = run_command(testing::mltrain(file + " --set train.eval_every=6"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto evaluated = run_command(testing::mltrain(file + " --eval-only --resume auto"));
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_CONTAINS(evaluated.output, "| web ");
  int64_t records = 0;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("val_loss")) continue;
    ++records;
    const double mean = 0.7 * record["val_loss/web"].get<double>() +
                        0.2 * record["val_loss/code"].get<double>() +
                        0.1 * record["val_loss/books"].get<double>();
    EXPECT_NEAR(record["val_loss"].get<double>(), mean, 1e-9) << line;
  }
  EXPECT_EQ(records, 3) << "steps 6 and 12, and --eval-only";
}

TEST(DataSources, EachKindOfBadSourceIsOneLineAndExitTwo) {
  TemporaryDirectory dir;
  const Config good = blend_run(dir, {0.7, 0.2, 0.1});
  const auto refused = [&](Config config, const std::string& message) {
    const auto run = run_command(testing::mltrain(write_config(dir, config, "bad.yaml")));
    EXPECT_EQ(run.exit_code, kExitUserError) << run.output;
    const size_t at = run.output.find(message);
    ASSERT_NE(at, std::string::npos) << message << "\n" << run.output;
    // One line, the last: after the lines that log what was opened.
    EXPECT_EQ(run.output.find('\n', at), run.output.size() - 1) << run.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints")) << message;
  };
  Config config = good;
  config.sources[1].name = "";
  refused(config, "data.sources entry 2: its name is empty");
  config = good;
  config.sources[2].name = "web";
  refused(config, "data.sources entry 3: the name web is given twice");
  config = good;
  config.sources[0].weight = -0.5;
  refused(config, "data.sources entry 1 (web): weight must be a finite number of at least 0");
  config = good;
  for (DataSource& source : config.sources) source.weight = 0;
  refused(config, "every weight of data.sources is 0");
  config = good;
  config.sources[1].train = (dir / "nowhere" / "train_*.bin").string();
  refused(config, "data.sources code: no token shards match " + config.sources[1].train);
  config = good;
  testing::write_text(dir / "web" / "tokenizer.model", "one tokenizer");
  testing::write_text(dir / "books" / "tokenizer.model", "another tokenizer");
  refused(config, "data.sources books: its shards were made with another tokenizer");
}

}  // namespace
}  // namespace mltrain
