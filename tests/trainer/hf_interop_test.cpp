// Export to and import from Hugging Face transformers, checked against transformers itself
// (tests/reference/hf_check.py): an exported directory loads as a LlamaForCausalLM with the logits
// mltrain computes, and a model that save_pretrained wrote (sharded or not) is imported with the
// logits transformers computes, within 1e-4 in fp32. Directories of another model are errors that
// list what differs, and an export is all or nothing.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "data/corpus_prep.h"
#include "data/tokenizer.h"
#include "model/interop/hf_checkpoint.h"
#include "model/interop/hf_state_dict.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/run/hf_export.h"
#include "trainer/run/training_run.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;
using testing::write_text;

constexpr double kLogitTolerance = 1e-4;

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// What transformers computed: logits (and loss) on the batch, and how it sees the model.
struct Reference {
  at::Tensor logits;
  at::Tensor loss;
  nlohmann::json info;
};

Reference run_reference(const std::string& arguments, const std::filesystem::path& out_dir) {
  const std::string command = fmt::format("{} {}/tests/reference/hf_check.py {} {}", MLTRAIN_PYTHON,
                                          MLTRAIN_SOURCE_DIR, arguments, out_dir.string());
  const testing::CommandResult run = testing::run_command(command);
  if (run.exit_code != 0) throw std::runtime_error(command + "\n" + run.output);
  NamedTensors out = load_safetensors(out_dir / "logits.safetensors");
  return {out.at("logits"), out.contains("loss") ? out.at("loss") : at::Tensor(),
          nlohmann::json::parse(testing::read_text(out_dir / "info.json"))};
}

// A batch of tokens, written where the reference reads it.
at::Tensor write_batch(const std::filesystem::path& path, int64_t vocab_size) {
  at::manual_seed(7);
  const at::Tensor tokens = at::randint(vocab_size, {2, 24}, at::kLong);
  save_safetensors(path, {{"tokens", tokens}});
  return tokens;
}

ModelConfig tiny_model(bool tied) {
  ModelConfig config = testing::tiny_config();
  config.tie_word_embeddings = tied;
  config.rope_theta = 5000.0;  // not LlamaConfig's default: a base that is not carried over shows
  config.norm_eps = 1e-5;
  return config;
}

// The LlamaConfig arguments of a model, written by hand: the reference of hf_config_json.
std::string llama_config_arguments(const ModelConfig& c) {
  return fmt::format(
      R"({{"vocab_size": {}, "hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {},
          "num_attention_heads": {}, "num_key_value_heads": {}, "head_dim": {},
          "max_position_embeddings": {}, "rms_norm_eps": {}, "rope_theta": {},
          "tie_word_embeddings": {}}})",
      c.vocab_size, c.d_model, c.d_ffn, c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim,
      c.max_seq_len, c.norm_eps, c.rope_theta, c.tie_word_embeddings);
}

// A model with random norms too: with the norms at one, swapping two of them would not show.
Llama random_model(const ModelConfig& config) {
  at::manual_seed(3);
  Llama model(config, Kernels::fused_cpu);
  at::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    if (item.key().find("norm") != std::string::npos)
      item.value().add_(at::randn_like(item.value()) * 0.2);
  }
  return model;
}

at::Tensor logits_of(Llama& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model(tokens);
}

Config export_config(const ModelConfig& model) {
  Config config;
  config.model = model;
  config.data.tokenizer = "";
  return config;
}

void expect_transformers_loads_the_export(bool tied) {
  TemporaryDirectory dir;
  const Config config = export_config(tiny_model(tied));
  Llama model = random_model(config.model);
  save_model_weights(model, dir / "weights.safetensors");
  export_hf(config, dir / "weights.safetensors", dir / "hf");
  for (const char* file : {"model.safetensors", "config.json", "generation_config.json"})
    EXPECT_TRUE(std::filesystem::exists(dir / "hf" / file)) << file;
  EXPECT_EQ(load_safetensors(dir / "hf" / "model.safetensors").contains("lm_head.weight"), !tied)
      << "a tied model is saved without lm_head.weight, as transformers saves it";

  const at::Tensor tokens = write_batch(dir / "batch.safetensors", config.model.vocab_size);
  const Reference reference = run_reference(
      fmt::format("load {} {}", (dir / "hf").string(), (dir / "batch.safetensors").string()),
      dir / "out");
  EXPECT_EQ(reference.info["class"], "LlamaForCausalLM");
  EXPECT_EQ(reference.info["tie_word_embeddings"], tied);
  EXPECT_EQ(reference.info["lm_head_is_embedding"], tied);
  EXPECT_TRUE(reference.info["bos_token_id"].is_null()) << "no tokenizer, no special tokens";
  EXPECT_LE(max_difference(logits_of(model, tokens), reference.logits), kLogitTolerance);
}

TEST(HfExport, TransformersLoadsATiedModelWithTheSameLogits) {
  expect_transformers_loads_the_export(true);
}

TEST(HfExport, TransformersLoadsAnUntiedModelWithTheSameLogits) {
  expect_transformers_loads_the_export(false);
}

TEST(HfExport, ATokenizerIsExportedAndNamesTheSpecialTokens) {
  TemporaryDirectory dir;
  const std::vector<std::filesystem::path> fortunes = {"/usr/share/games/fortunes/computers"};
  train_tokenizer(read_documents(fortunes, DocumentFormat::kFortune), /*vocab_size=*/600,
                  /*threads=*/2, dir / "tokenizer.model");
  Config config = export_config(tiny_model(true));
  config.model.vocab_size = 640;
  config.data.tokenizer = (dir / "tokenizer.model").string();
  Llama model = random_model(config.model);
  save_model_weights(model, dir / "weights.safetensors");
  export_hf(config, dir / "weights.safetensors", dir / "hf");
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"})
    EXPECT_TRUE(std::filesystem::exists(dir / "hf" / file)) << file;

  write_batch(dir / "batch.safetensors", config.model.vocab_size);
  const Reference reference = run_reference(
      fmt::format("load {} {}", (dir / "hf").string(), (dir / "batch.safetensors").string()),
      dir / "out");
  const Tokenizer tokenizer(dir / "tokenizer.model");
  // A document starts where the one before ended: both are the end-of-document token.
  for (const char* key : {"bos_token_id", "generation_bos_token_id", "tokenizer_bos_token_id",
                          "eos_token_id", "generation_eos_token_id", "tokenizer_eos_token_id"})
    EXPECT_EQ(reference.info[key], tokenizer.end_of_document()) << key;
}

void expect_import_of_save_pretrained(bool tied, const std::string& max_shard_size) {
  TemporaryDirectory dir;
  const ModelConfig config = tiny_model(tied);
  write_text(dir / "llama.json", llama_config_arguments(config));
  const at::Tensor tokens = write_batch(dir / "batch.safetensors", config.vocab_size);
  const Reference reference =
      run_reference(fmt::format("create {} {} {} {}", (dir / "llama.json").string(), max_shard_size,
                                (dir / "hf").string(), (dir / "batch.safetensors").string()),
                    dir / "out");
  const bool sharded = max_shard_size != "none";
  EXPECT_EQ(std::filesystem::exists(dir / "hf" / "model.safetensors.index.json"), sharded);
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "hf"))
    files += entry.path().extension() == ".safetensors" ? 1 : 0;
  EXPECT_EQ(files > 1, sharded) << files << " .safetensors files";

  ASSERT_TRUE(is_hf_model_directory(dir / "hf"));
  Llama model(config, Kernels::fused_cpu);
  load_hf_model(model, dir / "hf");
  EXPECT_LE(max_difference(logits_of(model, tokens), reference.logits), kLogitTolerance);
}

TEST(HfImport, ATiedModelSavedByTransformersGivesTheSameLogits) {
  expect_import_of_save_pretrained(true, "none");
}

TEST(HfImport, AnUntiedShardedModelSavedByTransformersGivesTheSameLogits) {
  expect_import_of_save_pretrained(false, "40KB");
}

// model.init_from starts a fresh run from the directory (at a learning rate of zero the run's
// checkpoint computes what transformers computes); a resumed run continues from its checkpoint,
// whatever model.init_from names by then.
TEST(HfImport, InitFromStartsAFreshRunAndAResumedRunKeepsItsCheckpoint) {
  TemporaryDirectory dir;
  Config config = testing::tiny_run(dir.path());
  write_text(dir / "llama.json", llama_config_arguments(config.model));
  const at::Tensor tokens = write_batch(dir / "batch.safetensors", config.model.vocab_size);
  const Reference reference =
      run_reference(fmt::format("create {} none {} {}", (dir / "llama.json").string(),
                                (dir / "hf").string(), (dir / "batch.safetensors").string()),
                    dir / "out");
  config.init_from = (dir / "hf").string();
  config.optim.warmup_steps = 1;
  config.train.ckpt_every = 2;
  const auto weights_at = [&](const std::string& run, int step) {
    Llama model(config.model, Kernels::fused_cpu);
    load_model_weights(
        model, dir / run / "checkpoints" / fmt::format("step_{:08d}", step) / "model.safetensors");
    return model;
  };

  Config still = config;
  still.optim.lr = 0.0;
  still.optim.min_lr = 0.0;
  still.train.max_steps = 2;
  still.train.run_dir = (dir / "still").string();
  train(still);
  Llama started = weights_at("still", 2);
  EXPECT_LE(max_difference(logits_of(started, tokens), reference.logits), kLogitTolerance);

  Config moving = config;
  moving.train.max_steps = 2;
  moving.train.run_dir = (dir / "moving").string();
  train(moving);
  moving.optim.lr = 0.0;
  moving.optim.min_lr = 0.0;
  moving.train.max_steps = 3;
  // Where fresh weights would come from is no part of the model: a changed (here absent)
  // directory neither stops the resume nor is read.
  moving.init_from = (dir / "elsewhere").string();
  train(moving, "auto");
  Llama trained = weights_at("moving", 2);
  Llama resumed = weights_at("moving", 3);
  EXPECT_TRUE(logits_of(resumed, tokens).equal(logits_of(trained, tokens)))
      << "the resumed run must continue from its checkpoint, not from model.init_from";
  EXPECT_GT(max_difference(logits_of(resumed, tokens), reference.logits), 1e-3);
}

// The keys config.json is compared on, spelled by hand as transformers writes them.
const char* const kOtherModelConfig = R"({
  "model_type": "llama", "vocab_size": 97, "hidden_size": 128, "intermediate_size": 96,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
  "tie_word_embeddings": false})";

std::string load_error(Llama& model, const std::filesystem::path& directory) {
  try {
    load_hf_model(model, directory);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(HfImport, AMismatchedConfigListsEveryDifferingKey) {
  TemporaryDirectory dir;
  std::filesystem::create_directories(dir / "hf");
  write_text(dir / "hf" / "config.json", kOtherModelConfig);
  save_safetensors(dir / "hf" / "model.safetensors", {{"unused", at::zeros({1})}});
  Llama model(tiny_model(true), Kernels::fused_cpu);
  const std::string message = load_error(model, dir / "hf");
  const std::string config_json = (dir / "hf" / "config.json").string();
  for (const std::string difference :
       {"model.d_model: 64 in the config, 128 in ", "model.n_layers: 2 in the config, 3 in ",
        "model.rope_theta: 5000 in the config, 500000 in ",
        "model.norm_eps: 1e-05 in the config, 1e-06 in ",
        "model.tie_word_embeddings: true in the config, false in "}) {
    EXPECT_CONTAINS(message, difference + config_json);
  }
  EXPECT_EQ(message.find("vocab_size"), std::string::npos) << message;
  EXPECT_EQ(message.find("max_seq_len"), std::string::npos)
      << "max_position_embeddings only bounds the positions; it is not compared";
}

TEST(HfImport, ReadsTheOldAndTheNewSpellingWithLlamaConfigDefaults) {
  const HfConfig old_spelling = parse_hf_config(
      R"({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
          "rope_theta": 500000.0, "rope_scaling": null, "torch_dtype": "bfloat16",
          "eos_token_id": [2, 7], "bos_token_id": null})",
      "old.json");
  EXPECT_EQ(old_spelling.model.rope_theta, 500000.0);
  EXPECT_EQ(old_spelling.model.n_kv_heads, 8) << "num_key_value_heads defaults to the heads";
  EXPECT_EQ(old_spelling.model.head_dim, 32) << "head_dim defaults to hidden_size / heads";
  EXPECT_EQ(old_spelling.model.vocab_size, 32000);
  EXPECT_EQ(old_spelling.model.d_ffn, 11008);
  EXPECT_EQ(old_spelling.model.norm_eps, 1e-6);
  EXPECT_FALSE(old_spelling.model.tie_word_embeddings);
  EXPECT_EQ(old_spelling.eos_token_id, 2);
  EXPECT_FALSE(old_spelling.bos_token_id.has_value());

  const HfConfig new_spelling = parse_hf_config(
      R"({"model_type": "llama", "dtype": "float32", "tie_word_embeddings": true,
          "rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"}})",
      "new.json");
  EXPECT_EQ(new_spelling.model.rope_theta, 20000.0);
  EXPECT_TRUE(new_spelling.model.tie_word_embeddings);
  EXPECT_EQ(new_spelling.bos_token_id, 1);

  const HfConfig written = parse_hf_config(
      hf_config_json({tiny_model(false), std::optional<int64_t>(1), std::optional<int64_t>(2)}),
      "written.json");
  EXPECT_TRUE(model_differences(written.model, tiny_model(false)).empty());
  EXPECT_EQ(written.model.max_seq_len, tiny_model(false).max_seq_len);
  EXPECT_EQ(written.eos_token_id, 2);
  const nlohmann::json both = nlohmann::json::parse(hf_config_json({tiny_model(false), {}, {}}));
  EXPECT_EQ(both["rope_theta"], 5000.0);
  EXPECT_EQ(both["rope_parameters"]["rope_theta"], 5000.0);
  EXPECT_EQ(both["dtype"], "float32");
  EXPECT_EQ(both["torch_dtype"], "float32");
}

TEST(HfImport, WhatMltrainDoesNotComputeIsRefusedByName) {
  const std::string base = R"("model_type": "llama", "hidden_size": 64, "num_attention_heads": 4)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("model_type": "mistral", "hidden_size": 64)", "model_type is \"mistral\""},
      {base + R"(, "hidden_act": "gelu")", "hidden_act \"gelu\" is not supported"},
      {base + R"(, "attention_bias": true)", "attention_bias is true"},
      {base + R"(, "mlp_bias": true)", "mlp_bias is true"},
      {base + R"(, "rope_scaling": {"type": "linear", "factor": 2.0})",
       "rope_scaling of type \"linear\" is not supported"},
      {base + R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0})",
       "rope_parameters of type \"llama3\" is not supported"},
      {base + R"(, "hidden_size": "wide")", "\"hidden_size\" must be an integer"},
  };
  for (const auto& [fields, expected] : cases) {
    try {
      parse_hf_config("{" + fields + "}", "DIR/config.json");
      ADD_FAILURE() << "accepted: " << fields;
    } catch (const UserError& error) {
      EXPECT_CONTAINS(std::string(error.what()), "DIR/config.json: " + expected);
    }
  }
}

// A sharded directory whose index names model-00002-of-00002.safetensors, which is not there.
TEST(HfImport, AMissingShardIsNamed) {
  TemporaryDirectory dir;
  const ModelConfig config = tiny_model(true);
  Llama model = random_model(config);
  std::filesystem::create_directories(dir / "hf");
  write_text(dir / "hf" / "config.json", hf_config_json({config, {}, {}}));
  nlohmann::json weight_map;
  NamedTensors first_shard;
  for (const auto& [name, tensor] : hf_state_dict(model)) {
    const bool in_first = name.starts_with("model.embed") || name.starts_with("model.layers.0.");
    weight_map[name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    if (in_first) first_shard.emplace(name, tensor);
  }
  save_safetensors(dir / "hf" / "model-00001-of-00002.safetensors", first_shard);
  write_text(dir / "hf" / "model.safetensors.index.json",
             nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  const std::string message = load_error(model, dir / "hf");
  EXPECT_CONTAINS(message, "model.safetensors.index.json names shards missing from");
  EXPECT_CONTAINS(message, "model-00002-of-00002.safetensors (holding");
  EXPECT_EQ(message.find("model-00001-of-00002"), std::string::npos) << message;

  weight_map["model.norm.weight"] = "../outside.safetensors";
  write_text(dir / "hf" / "model.safetensors.index.json",
             nlohmann::json{{"weight_map", weight_map}}.dump());
  EXPECT_CONTAINS(load_error(model, dir / "hf"),
                  "the shard \"../outside.safetensors\" of model.norm.weight is not a file name");
}

// The entries of `directory`, by name.
std::set<std::string> entries(const std::filesystem::path& directory) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(directory))
    names.insert(entry.path().filename().string());
  return names;
}

TEST(HfExport, ANonEmptyOutputDirectoryIsRefusedAndLeftAlone) {
  TemporaryDirectory dir;
  const Config config = export_config(tiny_model(true));
  save_model_weights(random_model(config.model), dir / "weights.safetensors");
  std::filesystem::create_directories(dir / "hf");
  write_text(dir / "hf" / "notes.txt", "mine");
  write_text(dir / "file", "also mine");
  for (const char* out : {"hf", "file"}) {
    try {
      export_hf(config, dir / "weights.safetensors", dir / out);
      ADD_FAILURE() << "exported into " << out;
    } catch (const UserError& error) {
      EXPECT_CONTAINS(std::string(error.what()), "already exists");
      EXPECT_CONTAINS(std::string(error.what()), "nothing was written");
    }
  }
  EXPECT_EQ(entries(dir / "hf"), std::set<std::string>{"notes.txt"});
  EXPECT_EQ(testing::read_text(dir / "hf" / "notes.txt"), "mine");
  EXPECT_EQ(testing::read_text(dir / "file"), "also mine");
  EXPECT_EQ(entries(dir.path()), (std::set<std::string>{"file", "hf", "weights.safetensors"}));

  std::filesystem::create_directories(dir / "empty");
  export_hf(config, dir / "weights.safetensors", dir / "empty/");
  EXPECT_TRUE(is_hf_model_directory(dir / "empty"));
}

// The files are written beside the output directory and renamed into place: until then the output
// directory does not exist, and after a failure neither it nor the temporary one does.
TEST(HfExport, AFailureMidwayLeavesNothingBehind) {
  TemporaryDirectory dir;
  const Config config = export_config(tiny_model(true));
  save_model_weights(random_model(config.model), dir / "weights.safetensors");
  bool failed = false;
  const auto fail_after_weights = [&](const std::filesystem::path& staging) {
    EXPECT_EQ(staging.parent_path(), dir.path());
    EXPECT_TRUE(std::filesystem::exists(staging / "model.safetensors"));
    EXPECT_FALSE(std::filesystem::exists(dir / "hf"));
    failed = true;
    throw std::runtime_error("disk full");
  };
  EXPECT_THROW(export_hf(config, dir / "weights.safetensors", dir / "hf", fail_after_weights),
               std::runtime_error);
  EXPECT_TRUE(failed);
  EXPECT_EQ(entries(dir.path()), std::set<std::string>{"weights.safetensors"});

  export_hf(config, dir / "weights.safetensors", dir / "hf");
  EXPECT_EQ(entries(dir.path()), (std::set<std::string>{"hf", "weights.safetensors"}));
  EXPECT_EQ(entries(dir / "hf"),
            (std::set<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
}

// An empty OUT_DIR that another program fills while the export is written is refused as a full
// one is (exit code 2), when the export would replace it: what was put there stays.
TEST(HfExport, AnOutputDirectoryFilledMeanwhileIsRefusedAndKept) {
  TemporaryDirectory dir;
  const Config config = export_config(tiny_model(true));
  save_model_weights(random_model(config.model), dir / "weights.safetensors");
  std::filesystem::create_directories(dir / "hf");
  const auto fill_meanwhile = [&](const std::filesystem::path&) {
    write_text(dir / "hf" / "theirs.txt", "someone else's");
  };
  try {
    export_hf(config, dir / "weights.safetensors", dir / "hf", fill_meanwhile);
    FAIL() << "expected a UserError";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "it was filled while the export was written");
  }
  EXPECT_EQ(entries(dir / "hf"), std::set<std::string>{"theirs.txt"});
  EXPECT_EQ(entries(dir.path()), (std::set<std::string>{"hf", "weights.safetensors"}));
}

}  // namespace
}  // namespace mltrain
