#include "trainer/checkpoint/checkpoint_store.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/error.h"
#include "model/interop/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/run/training_run.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// step -> loss, and step -> val_loss, of every line of a metrics.jsonl.
struct Curves {
  std::map<int64_t, double> loss;
  std::map<int64_t, double> val_loss;
};

Curves read_curves(const std::filesystem::path& run_dir) {
  Curves curves;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("loss")) curves.loss[record["step"]] = record["loss"];
    if (record.contains("val_loss")) curves.val_loss[record["step"]] = record["val_loss"];
  }
  return curves;
}

void expect_same_tensors(const std::filesystem::path& a, const std::filesystem::path& b) {
  const NamedTensors first = load_safetensors(a);
  const NamedTensors second = load_safetensors(b);
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [name, tensor] : first) {
    EXPECT_TRUE(at::equal(tensor, second.at(name)))
        << name << " differs between " << a << " and " << b;
  }
}

Config resumable_run(const TemporaryDirectory& dir, const std::string& run) {
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 14;
  config.train.log_every = 3;
  config.train.eval_every = 4;
  config.train.run_dir = (dir / run).string();
  return config;
}

TEST(Resume, StoppedAndResumedRunEqualsAnUnbrokenOneBitForBit) {
  TemporaryDirectory dir;
  train(resumable_run(dir, "unbroken"));

  Config first_half = resumable_run(dir, "resumed");
  first_half.train.stop_at = 7;  // neither a multiple of log_every (3) nor of eval_every (4)
  train(first_half);
  const auto halfway = CheckpointStore(first_half.train.run_dir).latest();
  ASSERT_TRUE(halfway);
  EXPECT_EQ(halfway->filename(), "step_00000007");
  train(resumable_run(dir, "resumed"), "auto");

  const Curves unbroken = read_curves(dir / "unbroken");
  const Curves resumed = read_curves(dir / "resumed");
  for (const int64_t step : {1, 3, 6, 9, 12, 14}) {
    ASSERT_TRUE(resumed.loss.contains(step)) << step;
    EXPECT_EQ(resumed.loss.at(step), unbroken.loss.at(step)) << "loss of step " << step;
  }
  EXPECT_EQ(resumed.val_loss, unbroken.val_loss);
  expect_same_tensors(dir / "unbroken/checkpoints/step_00000014/model.safetensors",
                      dir / "resumed/checkpoints/step_00000014/model.safetensors");
  expect_same_tensors(dir / "unbroken/checkpoints/step_00000014/optimizer.safetensors",
                      dir / "resumed/checkpoints/step_00000014/optimizer.safetensors");
}

TEST(Checkpoints, LayoutStateAndRetention) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 12;
  config.train.ckpt_every = 2;
  config.train.keep_last = 2;
  config.train.keep_every = 4;
  train(config);
  const auto checkpoints = dir / "run" / "checkpoints";
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints))
    names.insert(entry.path().filename());
  // The newest two, the multiples of 4, and the pointer.
  EXPECT_EQ(names, (std::set<std::string>{"latest", "step_00000004", "step_00000008",
                                          "step_00000010", "step_00000012"}));
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000012\n");
  const auto state =
      nlohmann::json::parse(testing::read_text(checkpoints / "step_00000012" / "state.json"));
  EXPECT_EQ(state["step"], 12);
  EXPECT_EQ(state["samples_consumed"], 12 * 16);
  EXPECT_EQ(state["tokens_seen"], 12 * 16 * 16);
  EXPECT_EQ(state["world_size"], 1);
  EXPECT_TRUE(state["best_val_loss"].is_number());
  // The spike guard's level, an average of the applied steps' losses, lies among them.
  double lowest = 1e300;
  double highest = 0;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("loss") || record.contains("skipped")) continue;
    lowest = std::min(lowest, record["loss"].get<double>());
    highest = std::max(highest, record["loss"].get<double>());
  }
  EXPECT_GE(state["loss_level"].get<double>(), lowest);
  EXPECT_LE(state["loss_level"].get<double>(), highest);
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "config.yaml"}) {
    EXPECT_TRUE(state["checksums_xxh3"].contains(file)) << file;
  }
  EXPECT_TRUE(state["versions"].contains("torch"));
  EXPECT_EQ(load_config(checkpoints / "step_00000012" / "config.yaml").model.d_model, 32);
}

// A tiny run of `steps` steps in `dir`, trained once.
Config trained_run(const TemporaryDirectory& dir, int64_t steps) {
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = steps;
  config.optim.warmup_steps = 1;
  train(config);
  return config;
}

// The UserError of resuming `config`, or "".
std::string resume_error(const Config& config) {
  try {
    train(config, "auto");
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(Resume, DamagedCheckpointFilesAreNamed) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  const auto checkpoint = dir / "run" / "checkpoints" / "step_00000004";
  const std::string optimizer = testing::read_text(checkpoint / "optimizer.safetensors");
  std::string flipped = optimizer;
  flipped[flipped.size() / 2] ^= 0x10;
  testing::write_text(checkpoint / "optimizer.safetensors", flipped);
  config.train.max_steps = 8;
  EXPECT_CONTAINS(resume_error(config), "optimizer.safetensors: checksum mismatch");
  testing::write_text(checkpoint / "optimizer.safetensors",
                      optimizer.substr(0, optimizer.size() - 100));
  EXPECT_CONTAINS(resume_error(config), "optimizer.safetensors: checksum mismatch");
  std::filesystem::remove(checkpoint / "model.safetensors");
  EXPECT_CONTAINS(resume_error(config), "model.safetensors: missing from the checkpoint");
  testing::write_text(checkpoint / "state.json", "{\"step\": ");
  EXPECT_CONTAINS(resume_error(config), "state.json: damaged checkpoint state");
}

// A state.json "blend" of sources (name, samples consumed, before the start), each of weight 1.
nlohmann::json blend(int64_t start,
                     const std::vector<std::tuple<std::string, int64_t, int64_t>>& sources) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [name, consumed, at_start] : sources)
    list.push_back(
        {{"name", name}, {"weight", 1.0}, {"consumed", consumed}, {"consumed_at_start", at_start}});
  return {{"start", start}, {"sources", list}};
}

// state.json is read as strictly as a config: of each key that is of the wrong type, out of range
// or inconsistent with the others, the file and the key are named, and nothing is trained.
TEST(Resume, AStateOfWrongTypesOrAbsurdValuesNamesTheFileAndTheKey) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  config.train.max_steps = 8;
  const auto checkpoint = dir / "run" / "checkpoints" / "step_00000004";
  const auto saved = nlohmann::json::parse(testing::read_text(checkpoint / "state.json"));
  const std::string path = (checkpoint / "state.json").string();
  const std::string kDeep = "arrays nested 100000 deep";
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](auto& state) { state["step"] = "abc"; },
       "\"step\" must be an integer from 1 to 9007199254740992, got \"abc\""},
      {[](auto& state) { state["step"] = int64_t{1} << 62; }, "\"step\" must be an integer"},
      {[](auto& state) { state["step"] = 3; },
       "\"step\" is 3, but the checkpoint directory is step_00000004"},
      {[](auto& state) { state["samples_consumed"] = INT64_MAX; },
       "\"samples_consumed\" must be an integer from 4 to 9007199254740992"},
      {[](auto& state) { state["samples_consumed"] = 2; },
       "\"samples_consumed\" must be an integer from 4"},
      {[](auto& state) { state["tokens_seen"] = 1 << 30; },
       "\"tokens_seen\" (1073741824) is more than \"samples_consumed\" (64) windows of at most "
       "model.max_seq_len (32) tokens hold"},
      {[](auto& state) { state["world_size"] = 0; },
       "\"world_size\" must be an integer from 1 to 1048576, got 0"},
      {[](auto& state) { state["learning_rate"] = "fast"; },
       "\"learning_rate\" must be a number of at least 0"},
      {[](auto& state) { state["best_val_loss"] = -1; },
       "\"best_val_loss\" must be a number of at least 0 or null"},
      {[](auto& state) { state["loss_level"] = "high"; },
       "\"loss_level\" must be a number of at least 0, got \"high\""},
      {[](auto& state) { state["rng"]["cpu"] = "zz"; },
       "\"rng.cpu\" must be a string of lowercase hexadecimal digits"},
      {[](auto& state) { state["rng"]["cpu"] = "00"; }, "\"rng.cpu\" holds 2 digits where"},
      // Checked without a regular expression, whose recursion a long string overflowed.
      {[](auto& state) { state["rng"]["cpu"] = std::string(100'000, 'a'); },
       "\"rng.cpu\" holds 100000 digits where"},
      // Never printed whole: printing recurses once a level (kDeep is put in as text below).
      {[&](auto& state) { state["step"] = kDeep; },
       "\"step\" must be an integer from 1 to 9007199254740992, got a JSON array"},
      {[](auto& state) { state.erase("rng"); }, "\"rng\" is missing"},
      {[](auto& state) { state["checksums_xxh3"]["../../etc/passwd"] = "0000000000000000"; },
       "\"checksums_xxh3\" lists files that are not a checkpoint's"},
      {[](auto& state) { state["checksums_xxh3"]["config.yaml"] = 5; },
       "\"checksums_xxh3.config.yaml\" must be a string of lowercase hexadecimal digits"},
      {[](auto& state) { state["format"] = 3; }, "\"format\" must be an integer from 1 to 2"},
      {[](auto& state) { state = nlohmann::json::array(); }, "not a JSON object"},
      // A blend's counts (data.sources): each sample is one source's, each name given once.
      {[](auto& state) { state["blend"] = 5; },
       "\"blend\" must be an object with \"start\" and a list of \"sources\""},
      {[](auto& state) {
         state["blend"] = blend(0, {{"a", 32, 0}, {"a", 32, 0}});
       },
       "\"blend\" names the source \"a\" twice"},
      {[](auto& state) {
         state["blend"] = blend(0, {{"a", 10, 0}});
       },
       "\"blend\" counts 10 samples and 0 before its start, where the checkpoint consumed 64"},
      {[](auto& state) {
         state["blend"] = blend(0, {{"a", 40, 41}, {"b", 24, 0}});
       },
       "blend source 1: \"consumed_at_start\" must be an integer from 0 to 40, got 41"},
  };
  for (const auto& [damage, message] : cases) {
    nlohmann::json state = saved;
    damage(state);
    std::string text = state.dump();
    if (const size_t deep = text.find(nlohmann::json(kDeep).dump()); deep != std::string::npos)
      text.replace(deep, kDeep.size() + 2, std::string(100'000, '[') + std::string(100'000, ']'));
    testing::write_text(checkpoint / "state.json", text);
    const std::string error = resume_error(config);
    EXPECT_CONTAINS(error, path);
    EXPECT_CONTAINS(error, message);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000008"));
}

// A checkpoint saved before the spike guard has no level: the run resumes, and its level starts
// again from the next step's loss.
TEST(Resume, ACheckpointWithoutASpikeLevelResumes) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  const auto state_path = dir / "run" / "checkpoints" / "step_00000004" / "state.json";
  nlohmann::json state = nlohmann::json::parse(testing::read_text(state_path));
  ASSERT_TRUE(state.contains("loss_level"));
  state.erase("loss_level");
  testing::write_text(state_path, state.dump());
  config.train.max_steps = 6;
  EXPECT_EQ(resume_error(config), "");
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000006"));
}

// A checkpoint at or past the run's last step has nothing left to train: said so, not "trained -N
// steps".
TEST(Resume, ARunResumedAtItsLastStepHasNothingToTrain) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  const std::string metrics = testing::read_text(dir / "run" / "metrics.jsonl");
  config.train.max_steps = 3;
  config.optim.warmup_steps = 1;
  train(config, "auto");
  EXPECT_EQ(testing::read_text(dir / "run" / "metrics.jsonl"), metrics) << "nothing was run";
}

// What --resume takes is a checkpoint directory: a file in one, or weights alone (an export), is
// refused with what to give instead.
TEST(Resume, AFileOrWeightsAloneAreRefusedWithWhatToGive) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  config.train.max_steps = 6;
  const auto checkpoint = dir / "run" / "checkpoints" / "step_00000004";
  const auto refusal = [&](const std::filesystem::path& resume) {
    try {
      train(config, resume.string());
    } catch (const UserError& error) {
      return std::string(error.what());
    }
    return std::string("resumed");
  };
  EXPECT_CONTAINS(refusal(checkpoint / "model.safetensors"),
                  "a file, not a checkpoint directory: give the directory that holds it");
  std::filesystem::create_directories(dir / "export");
  std::filesystem::copy_file(checkpoint / "model.safetensors",
                             dir / "export" / "model.safetensors");
  EXPECT_CONTAINS(
      refusal(dir / "export"),
      "not a checkpoint (no state.json): weights alone (a Hugging Face export?) start a "
      "new run through model.init_from, not --resume");
}

TEST(Resume, AnotherModelShapeIsRefusedWithEveryDifferingKey) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  Config changed = config;
  changed.model.d_model = 64;
  changed.model.d_ffn = 128;
  changed.train.max_steps = 8;
  const std::string message = resume_error(changed);
  EXPECT_CONTAINS(message, "the checkpoint is of another model");
  EXPECT_CONTAINS(message, "model.d_model is 32 in the checkpoint, 64 in the config");
  EXPECT_CONTAINS(message, "model.d_ffn is 64 in the checkpoint, 128 in the config");
  EXPECT_CONTAINS(message, "resume it with the model keys it was saved with");
  // Keys outside the model may change.
  Config longer = config;
  longer.train.max_steps = 6;
  longer.optim.lr = 5e-3;
  EXPECT_EQ(resume_error(longer), "");
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000006"));
}

TEST(Resume, StaleTemporaryDirectoriesAreRemoved) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 2);
  const auto stale = dir / "run" / "checkpoints" / "step_00000004.tmp";
  std::filesystem::create_directories(stale);
  testing::write_text(stale / "model.safetensors", "half");
  config.train.max_steps = 4;
  train(config, "auto");
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(
      std::filesystem::exists(dir / "run" / "checkpoints" / "step_00000004" / "state.json"));
}

TEST(Resume, AFreshStartDoesNotTouchAnotherRunsCheckpoints) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  const auto checkpoints = dir / "run" / "checkpoints";
  const std::string saved = testing::read_text(checkpoints / "step_00000004" / "model.safetensors");
  config.train.max_steps = 8;
  try {
    train(config);
    FAIL() << "a fresh run started over saved checkpoints";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "already holds checkpoints (newest: step_00000004): continue that run "
                    "with --resume auto");
  }
  EXPECT_EQ(testing::read_text(checkpoints / "step_00000004" / "model.safetensors"), saved);
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000004\n");
}

// `latest` is the one source of truth for the newest checkpoint: a complete checkpoint it does not
// name (a save that crashed between the rename and the marker, or a run resumed from an earlier
// step) is neither resumed from nor pruned.
TEST(Resume, AutoResumesTheCheckpointThatLatestNames) {
  TemporaryDirectory dir;
  Config config = trained_run(dir, 4);
  const auto checkpoints = dir / "run" / "checkpoints";
  std::filesystem::copy(checkpoints / "step_00000004", checkpoints / "step_00000009");
  auto orphan =
      nlohmann::json::parse(testing::read_text(checkpoints / "step_00000009" / "state.json"));
  orphan["step"] = 9;
  orphan["samples_consumed"] = 9 * 16;
  testing::write_text(checkpoints / "step_00000009" / "state.json", orphan.dump());
  config.train.max_steps = 6;
  config.train.ckpt_every = 1;
  config.train.keep_last = 1;
  train(config, "auto");
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000006\n");
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000006"));
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000004")) << "pruned: keep_last 1";
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000005"))
      << "the newest checkpoint that a step applied after it confirms is kept";
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000009"))
      << "a later step's checkpoint was pruned";
  const auto state =
      nlohmann::json::parse(testing::read_text(checkpoints / "step_00000006" / "state.json"));
  EXPECT_EQ(state["samples_consumed"], 6 * 16) << "resumed from step 4, not from step 9";
}

// A run of 4 steps checkpointed at 2 and 4.
Config run_checkpointed_every_two(const TemporaryDirectory& dir) {
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 4;
  config.train.ckpt_every = 2;
  config.optim.warmup_steps = 1;
  train(config);
  return config;
}

// The files of checkpoint `name` under `checkpoints`, by path relative to it.
std::map<std::string, std::string> files_of(const std::filesystem::path& checkpoints,
                                            const std::string& name) {
  return testing::file_contents(checkpoints / name);
}

// Without `latest` (a save killed between its rename and the marker, or the marker deleted),
// --resume auto continues from the newest checkpoint, where it once started afresh and wrote its
// own checkpoints over the saved ones; they are left as they were.
TEST(Resume, AutoWithoutLatestResumesTheNewestCheckpoint) {
  TemporaryDirectory dir;
  Config config = run_checkpointed_every_two(dir);
  const auto checkpoints = dir / "run" / "checkpoints";
  const auto step_2 = files_of(checkpoints, "step_00000002");
  const auto step_4 = files_of(checkpoints, "step_00000004");
  std::filesystem::remove(checkpoints / "latest");
  EXPECT_EQ(CheckpointStore(dir / "run").latest(), checkpoints / "step_00000004");
  config.train.max_steps = 6;
  train(config, "auto");
  EXPECT_EQ(files_of(checkpoints, "step_00000002"), step_2);
  EXPECT_EQ(files_of(checkpoints, "step_00000004"), step_4);
  const auto state =
      nlohmann::json::parse(testing::read_text(checkpoints / "step_00000006" / "state.json"));
  EXPECT_EQ(state["samples_consumed"], 6 * 16) << "not resumed from step 4";
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000006\n");
}

// A save never deletes what holds its step's name: a later checkpoint of another branch of the run
// (resumed here from an earlier one), or a folder of the user's, is moved aside to
// step_XXXXXXXX.replaced-N, which nothing resumes from or prunes.
TEST(Checkpoints, ASaveKeepsWhatHoldsItsStepsNameAside) {
  TemporaryDirectory dir;
  Config config = run_checkpointed_every_two(dir);
  const auto checkpoints = dir / "run" / "checkpoints";
  const auto branch = files_of(checkpoints, "step_00000004");
  std::filesystem::create_directories(checkpoints / "step_00000006");
  testing::write_text(checkpoints / "step_00000006" / "notes.txt", "keep me");
  config.optim.lr *= 2;  // another branch from step 2
  config.train.max_steps = 6;
  train(config, (checkpoints / "step_00000002").string());

  EXPECT_EQ(files_of(checkpoints, "step_00000004.replaced-1"), branch);
  EXPECT_NE(files_of(checkpoints, "step_00000004"), branch);
  EXPECT_EQ(testing::read_text(checkpoints / "step_00000006.replaced-1" / "notes.txt"), "keep me");
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_00000006" / "state.json"));
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000006\n");
}

// The same checkpoint saved again replaces itself, with no copy left aside: a save that a kill
// kept from `latest` is saved again, bit for bit, by the run resumed from the checkpoint before.
TEST(Checkpoints, TheSameCheckpointSavedAgainReplacesItself) {
  TemporaryDirectory dir;
  Config config = run_checkpointed_every_two(dir);
  const auto checkpoints = dir / "run" / "checkpoints";
  const auto step_4 = files_of(checkpoints, "step_00000004");
  testing::write_text(checkpoints / "latest", "step_00000002\n");
  train(config, "auto");
  EXPECT_EQ(files_of(checkpoints, "step_00000004"), step_4);
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "step_00000004.replaced-1"));
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000004\n");
}

// A checkpoint found bad moves to step_XXXXXXXX.bad-N, where nothing resumes from or prunes it,
// and `latest` names the checkpoint given instead (none: the newest stands in for it).
TEST(Checkpoints, ACheckpointSetAsideIsNeitherLatestNorResumed) {
  TemporaryDirectory dir;
  run_checkpointed_every_two(dir);
  const auto checkpoints = dir / "run" / "checkpoints";
  const auto step_4 = files_of(checkpoints, "step_00000004");
  const CheckpointStore store(dir / "run");
  EXPECT_EQ(store.set_aside(4, 2), checkpoints / "step_00000004.bad-1");
  EXPECT_EQ(files_of(checkpoints, "step_00000004.bad-1"), step_4);
  EXPECT_EQ(testing::read_text(checkpoints / "latest"), "step_00000002\n");
  EXPECT_EQ(store.saved_steps(), std::vector<int64_t>{2});
  store.set_aside(2, std::nullopt);
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "latest"));
  EXPECT_EQ(store.latest(), std::nullopt);
}

TEST(Resume, AutoWithoutACheckpointStartsFresh) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 2;
  config.optim.warmup_steps = 1;
  train(config, "auto");  // nothing to resume from yet
  EXPECT_TRUE(CheckpointStore(dir / "run").latest());
}

}  // namespace
}  // namespace mltrain
