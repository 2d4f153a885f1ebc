// bench/time_to_loss_reference.py, the PyTorch side of bench/time_to_loss.sh, reads the config
// that `mltrain --dump-config` writes: when a key is added to the config, the reference must still
// read it (a dumped key it could not parse once failed every run of the benchmark, unseen).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sstream>

#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::CommandResult;

// The parameter count of a metrics.jsonl's start event, and its last validation loss.
struct RunRecord {
  int64_t parameters = -1;
  double last_val_loss = -1.0;
};

RunRecord read_run(const std::filesystem::path& metrics) {
  RunRecord run;
  std::istringstream lines(testing::read_text(metrics));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "start") run.parameters = record["parameters"].get<int64_t>();
    if (record.contains("val_loss")) run.last_val_loss = record["val_loss"].get<double>();
  }
  return run;
}

// `mltrain RUN --dump-config EXTRA`'s standard output into `dumped`, as bench/time_to_loss.sh
// writes it (what mltrain logs on standard error stays out of the file).
void dump_config(const std::filesystem::path& run, const std::string& extra,
                 const std::filesystem::path& dumped) {
  const CommandResult result =
      testing::run_command(fmt::format("({}/mltrain {} --dump-config {} > {})", MLTRAIN_BIN_DIR,
                                       run.string(), extra, dumped.string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

CommandResult reference(const std::filesystem::path& config, const std::filesystem::path& out) {
  return testing::run_command(
      fmt::format("{} {}/bench/time_to_loss_reference.py --config {} "
                  "--out {} --threads 1",
                  MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR, config.string(), out.string()));
}

// The tiny run on its learnable stream, with the embedding tied to the output and without: the
// reference builds mltrain's model from the dumped config (the same parameter count) and, like
// mltrain, learns the stream (from ln 32 = 3.47 to well under 1).
TEST(TimeToLossReference, TrainsTheConfigMltrainDumps) {
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    testing::TemporaryDirectory dir;
    Config config = testing::tiny_run(dir.path());
    config.model.tie_word_embeddings = tied;
    testing::write_text(dir / "run.yaml", config_to_yaml(config));
    const CommandResult trained = testing::run_tool("mltrain", (dir / "run.yaml").string());
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    dump_config(dir / "run.yaml", "", dir / "dumped.yaml");

    const CommandResult ran = reference(dir / "dumped.yaml", dir / "reference");
    ASSERT_EQ(ran.exit_code, 0) << ran.output;
    const RunRecord ours = read_run(dir / "run" / "metrics.jsonl");
    const RunRecord theirs = read_run(dir / "reference" / "metrics.jsonl");
    EXPECT_EQ(theirs.parameters, ours.parameters);
    EXPECT_GE(ours.last_val_loss, 0.0);
    EXPECT_LT(ours.last_val_loss, 1.0);
    EXPECT_GE(theirs.last_val_loss, 0.0);
    EXPECT_LT(theirs.last_val_loss, 1.0);
  }
}

// A blend of corpora (data.sources, dumped as a list) is refused with the reason, before any
// training.
TEST(TimeToLossReference, RefusesABlendOfCorpora) {
  testing::TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  testing::write_text(dir / "run.yaml", config_to_yaml(config));
  dump_config(dir / "run.yaml",
              fmt::format("--set 'data.sources=[{{name: a, train: \"{}\", val: \"{}\", "
                          "weight: 1}}]'",
                          config.data.train, config.data.val),
              dir / "dumped.yaml");
  const CommandResult refused = reference(dir / "dumped.yaml", dir / "reference");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_CONTAINS(refused.output, std::string("no data.sources"));
  EXPECT_FALSE(std::filesystem::exists(dir / "reference" / "metrics.jsonl"));
}

}  // namespace
}  // namespace mltrain
