#include "trainer/config/config.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;
using testing::write_text;

// The UserError message of loading `yaml` with `overrides` ("" when it loads).
std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  TemporaryDirectory dir;
  write_text(dir / "run.yaml", yaml);
  try {
    load_config(dir / "run.yaml", overrides);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(Config, DefaultsAreTheDesignDocumentsValues) {
  const Config c;
  EXPECT_EQ(c.model.vocab_size, 4096);
  EXPECT_EQ(c.model.max_seq_len, 1024);
  EXPECT_EQ(c.model.init_std, 0.02);
  EXPECT_EQ(c.data.micro_batch, 16);
  EXPECT_EQ(c.data.grad_accum, 4);
  EXPECT_EQ(c.optim.lr, 6.0e-4);
  EXPECT_EQ(c.optim.beta2, 0.95);
  EXPECT_EQ(c.train.precision, "auto");
  EXPECT_EQ(c.train.kernels, "auto");
  EXPECT_EQ(c.train.keep_last, 3);
  EXPECT_EQ(c.dist.bucket_mb, 25.0);
  EXPECT_EQ(c.dist.timeout_s, 600);
}

TEST(Config, FileValuesAndOverridesApplyInOrder) {
  TemporaryDirectory dir;
  write_text(dir / "run.yaml", "model:\n  d_model: 256\n  n_layers: 4\noptim:\n  schedule: wsd\n");
  const Config c =
      load_config(dir / "run.yaml", {"model.n_layers=6", "train.run_dir=runs/x", "model.n_layers=8",
                                     "dist.overlap=false", "optim.lr=1e-3"});
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.model.n_layers, 8);
  EXPECT_EQ(c.optim.schedule, "wsd");
  EXPECT_EQ(c.train.run_dir, "runs/x");
  EXPECT_EQ(c.dist.overlap, "false");
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.model.n_q_heads, 8) << "untouched keys keep their defaults";
}

TEST(Config, UnknownKeyNamesFileLineAndNearestKey) {
  const std::string message = config_error("model:\n  d_model: 256\n  n_kv_haeds: 2\n");
  EXPECT_CONTAINS(message, "run.yaml:3");
  EXPECT_CONTAINS(message, "unknown key model.n_kv_haeds");
  EXPECT_CONTAINS(message, "did you mean model.n_kv_heads?");
  EXPECT_CONTAINS(config_error("optimizer:\n  lr: 0.1\n"), "did you mean optim.lr?");
  EXPECT_CONTAINS(
      config_error("", {"train.max_step=5"}),
      "--set train.max_step=5: unknown key train.max_step (did you mean train.max_steps?)");
}

// Names from nanoGPT, llm.c, Hugging Face and torchtitan are known, and win over the nearest
// spelling: learning_rate is nearer optim.min_lr than optim.lr.
TEST(Config, KeyNamesFromOtherTrainersPointAtMltrainsKey) {
  EXPECT_CONTAINS(
      config_error("", {"optim.learning_rate=1"}),
      "--set optim.learning_rate=1: unknown key optim.learning_rate (mltrain calls it optim.lr)");
  EXPECT_CONTAINS(config_error("", {"data.batch_size=8"}),
                  "unknown key data.batch_size (mltrain calls it data.micro_batch)");
  EXPECT_CONTAINS(config_error("", {"train.max_iters=100"}), "(mltrain calls it train.max_steps)");
  EXPECT_CONTAINS(config_error("model:\n  n_embd: 768\n"),
                  "run.yaml:2: unknown key model.n_embd (mltrain calls it model.d_model)");
  EXPECT_CONTAINS(config_error("", {"model.n_kv_head=2"}), "(mltrain calls it model.n_kv_heads)");
  EXPECT_CONTAINS(config_error("", {"optim.max_grad_norm=1"}),
                  "(mltrain calls it optim.grad_clip)");
  EXPECT_CONTAINS(config_error("", {"train.gradient_accumulation_steps=4"}),
                  "(mltrain calls it data.grad_accum)");
}

TEST(Config, KeyHintsIgnoreTheSectionAKnownNameWasPutIn) {
  EXPECT_CONTAINS(config_error("", {"model.block_size=256"}), "(mltrain calls it data.seq_len)");
  EXPECT_CONTAINS(config_error("", {"data.block_size=256"}), "(mltrain calls it data.seq_len)");
  EXPECT_CONTAINS(config_error("train:\n  learning_rate: 0.1\n"), "(mltrain calls it optim.lr)");
  EXPECT_CONTAINS(config_error("", {"data.vocab_size=256"}),
                  "unknown key data.vocab_size (did you mean model.vocab_size?)");
  EXPECT_CONTAINS(config_error("", {"model.beta2=0.99"}), "(did you mean optim.beta2?)");
}

TEST(Config, WrongTypesAreNamed) {
  EXPECT_CONTAINS(config_error("model:\n  d_model: wide\n"),
                  "model.d_model expects an integer, got \"wide\"");
  EXPECT_CONTAINS(config_error("model:\n  d_model: 1.5\n"), "model.d_model expects an integer");
  EXPECT_CONTAINS(config_error("optim:\n  lr: [1, 2]\n"),
                  "optim.lr expects a number, got a YAML sequence");
  EXPECT_CONTAINS(config_error("model:\n  tie_word_embeddings: sometimes\n"),
                  "model.tie_word_embeddings expects true or false");
  EXPECT_CONTAINS(config_error("model: 3\n"), "section model must be a mapping");
  EXPECT_CONTAINS(config_error("", {"data.seed=x"}),
                  "--set data.seed=x: data.seed expects an integer");
  EXPECT_CONTAINS(config_error("", {"data.seed"}), "expected section.key=value");
  EXPECT_CONTAINS(config_error("", {"model.d_model="}),
                  "--set model.d_model=: model.d_model expects an integer, got an empty value");
  EXPECT_CONTAINS(config_error("train:\n  max_steps:\n"),
                  "run.yaml:2: train.max_steps expects an integer, got an empty value");
}

// YAML reads an empty value as null; for a string key that is the empty string, which
// data.tokenizer takes to mean "no tokenizer".
TEST(Config, AnEmptyValueOfAStringKeyIsTheEmptyString) {
  TemporaryDirectory dir;
  write_text(dir / "quoted.yaml", "data:\n  tokenizer: \"\"\n");
  EXPECT_EQ(load_config(dir / "quoted.yaml").data.tokenizer, "");
  write_text(dir / "bare.yaml", "data:\n  tokenizer:\n");
  EXPECT_EQ(load_config(dir / "bare.yaml").data.tokenizer, "");
  EXPECT_EQ(load_config(dir / "quoted.yaml", {"data.tokenizer=x.model", "data.tokenizer="})
                .data.tokenizer,
            "");
  EXPECT_EQ(load_config(dir / "quoted.yaml", {"data.tokenizer=\"\""}).data.tokenizer, "");
}

// A second YAML document (after ---) would go unread: the file is refused, with the count.
TEST(Config, AFileOfSeveralYamlDocumentsIsRefused) {
  EXPECT_CONTAINS(config_error("model:\n  d_model: 32\n---\nmodel:\n  d_model: 64\n"),
                  "holds 2 YAML documents (separated by --- or ...): a config is one");
  EXPECT_EQ(config_error("---\nmodel:\n  d_model: 32\n"), "") << "one document, marked";
  EXPECT_EQ(config_error("model:\n  d_model: 32\n---\n"), "") << "a stray --- at the end";
}

TEST(Config, OutOfRangeValuesAreNamed) {
  EXPECT_CONTAINS(config_error("data:\n  micro_batch: 0\n"),
                  "data.micro_batch must be at least 1, got 0");
  EXPECT_CONTAINS(config_error("optim:\n  beta2: 1.5\n"),
                  "optim.beta2 must be at least 0 and below 1, got 1.5");
  // A decay of 1 never forgets: AdamW's bias correction divides by 1 - beta^t = 0.
  EXPECT_CONTAINS(config_error("optim:\n  beta1: 1\n"),
                  "optim.beta1 must be at least 0 and below 1, got 1");
  EXPECT_CONTAINS(config_error("train:\n  threads: 100000\n"),
                  "train.threads must be between 0 and 1024, got 100000");
  // Its milliseconds once overflowed the deadlines of the rendezvous and the collectives.
  EXPECT_CONTAINS(config_error("", {"dist.timeout_s=9223372036854775807"}),
                  "dist.timeout_s must be between 1 and 604800, got 9223372036854775807");
  // Infinity passes "at least": refused as what no key takes.
  for (const char* infinite : {"optim:\n  lr: .inf\n", "model:\n  rope_theta: .inf\n"}) {
    EXPECT_CONTAINS(config_error(infinite), "must be a finite number, got inf") << infinite;
  }
  EXPECT_CONTAINS(config_error("", {"dist.bucket_mb=.inf"}),
                  "dist.bucket_mb must be a finite number, got inf");
  EXPECT_CONTAINS(config_error("optim:\n  schedule: exponential\n"),
                  "optim.schedule must be one of cosine, constant, linear, wsd");
  EXPECT_CONTAINS(config_error("train:\n  device: tpu\n"),
                  "train.device must be one of auto, cpu, cuda");
  EXPECT_CONTAINS(config_error("", {"train.precision=fp16"}),
                  "train.precision must be one of auto, bf16, fp32, got \"fp16\"");
  EXPECT_CONTAINS(config_error("", {"train.kernels=fast"}),
                  "train.kernels must be one of auto, fused, fused_cuda, aten, got \"fast\"");
}

TEST(Config, InconsistentValuesAreNamed) {
  EXPECT_CONTAINS(config_error("model:\n  n_q_heads: 8\n  n_kv_heads: 3\n"),
                  "model.n_q_heads (8) must be a multiple of model.n_kv_heads (3)");
  EXPECT_CONTAINS(config_error("data:\n  seq_len: 2048\n"),
                  "data.seq_len (2048) exceeds model.max_seq_len (1024)");
  EXPECT_CONTAINS(config_error("train:\n  max_steps: 100\n"),
                  "optim.warmup_steps (200) exceeds train.max_steps (100)");
  EXPECT_CONTAINS(config_error("optim:\n  lr: 1e-5\n"),
                  "optim.min_lr (6e-05) exceeds optim.lr (1e-05)");
  EXPECT_CONTAINS(config_error("model:\n  head_dim: 63\n"), "model.head_dim (63) must be even");
  EXPECT_CONTAINS(config_error("", {"train.spike_guard=0.5"}),
                  "train.spike_guard (0.5) must be 0 (off) or above 1");
  EXPECT_CONTAINS(config_error("", {"train.spike_guard=-1"}), "train.spike_guard");
  EXPECT_EQ(config_error("", {"train.spike_guard=0"}), "") << "0 turns it off";
  EXPECT_CONTAINS(
      config_error("", {"optim.name=muon", "optim.lr=0", "optim.min_lr=0", "optim.muon_lr=0.01"}),
      "optim.muon_lr (0.01) is scaled by the schedule of optim.lr, which is 0");
  EXPECT_CONTAINS(config_error("", {"optim.name=sgd"}), "optim.name must be one of adamw, muon");
}

// Every other config mistake is an error, so a repeated key or section (of which YAML parsers
// keep the last) is one too, with both lines named.
TEST(Config, AKeyOrSectionGivenTwiceNamesBothLines) {
  EXPECT_CONTAINS(config_error("model:\n  d_model: 256\n  n_layers: 4\n  d_model: 512\n"),
                  "run.yaml:4: model.d_model is given twice, here and at line 2: keep one");
  EXPECT_CONTAINS(config_error("model:\n  d_model: 256\ndata:\n  seed: 1\nmodel:\n  n_layers: 4\n"),
                  "run.yaml:5: section model is given twice, here and at line 1: keep one");
  EXPECT_CONTAINS(config_error("model:\n  ? [a, b]\n  : 1\n"), "a key must be a plain name");
}

// Each count derived from the config (parameters, tokens per step, bytes) must stay countable:
// a slip of a digit stops at the config, with the keys named, instead of overflowing later.
TEST(Config, SizesBeyondWhatCanBeCountedNameTheirKeys) {
  EXPECT_CONTAINS(config_error("", {"model.d_model=1000000000", "model.head_dim=1000000000",
                                    "model.n_q_heads=1", "model.n_kv_heads=1"}),
                  "the model.* keys describe a model of 4.8e+19 parameters, more than the 2.81e+14 "
                  "mltrain can train: model.vocab_size 4096, d_model 1000000000");
  EXPECT_CONTAINS(
      config_error("", {"data.micro_batch=4611686018427387904", "data.grad_accum=4"}),
      "data.micro_batch (4611686018427387904) x data.grad_accum (4) x data.seq_len (1024) is "
      "1.89e+22 tokens per step and rank, more than mltrain takes (1.1e+12)");
  EXPECT_CONTAINS(config_error("", {"train.run_dir="}), "train.run_dir is empty");
  // The largest sizes that are refused are far beyond any real run's.
  EXPECT_EQ(
      config_error("", {"model.d_model=16384", "model.n_layers=128", "model.d_ffn=53248",
                        "model.n_q_heads=128", "model.n_kv_heads=8", "model.head_dim=128",
                        "model.vocab_size=128256", "data.micro_batch=64", "data.grad_accum=64"}),
      "");
}

TEST(Config, BadFilesAreNamed) {
  EXPECT_CONTAINS(config_error("model:\n  d_model: [1\n"), "not valid YAML");
  EXPECT_CONTAINS(config_error("- 1\n- 2\n"), "expected a mapping of sections");
  try {
    load_config("/nonexistent/run.yaml");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "/nonexistent/run.yaml: cannot open the config file: no such file");
  }
}

TEST(Config, DumpedConfigLoadsBackToTheSameConfig) {
  TemporaryDirectory dir;
  write_text(dir / "run.yaml", "data:\n  train: \"odd: 'name' #1 *.bin\"\noptim:\n  lr: 3.3e-4\n");
  const Config original =
      load_config(dir / "run.yaml", {"model.norm_eps=1e-5", "model.tie_word_embeddings=false"});
  const std::string dumped = config_to_yaml(original);
  write_text(dir / "dumped.yaml", dumped);
  const Config reloaded = load_config(dir / "dumped.yaml");
  EXPECT_EQ(config_to_yaml(reloaded), dumped);
  EXPECT_EQ(reloaded.data.train, "odd: 'name' #1 *.bin");
  EXPECT_EQ(reloaded.optim.lr, 3.3e-4);
  EXPECT_EQ(reloaded.model.norm_eps, 1e-5);
  EXPECT_FALSE(reloaded.model.tie_word_embeddings);
}

// data.sources, a list of mappings, dumps as YAML that loads back to the same sources; each kind of
// bad entry is one line naming the entry.
TEST(Config, DataSourcesRoundTripAndBadEntriesAreNamed) {
  TemporaryDirectory dir;
  write_text(
      dir / "run.yaml",
      "data:\n  sources:\n"
      "    - {name: web, train: \"w/train_*.bin\", val: \"w/val_*.bin\", weight: 0.7}\n"
      "    - name: \"odd: 'code' #1\"\n      train: c/train_*.bin\n      val: c/val_*.bin\n");
  const Config original = load_config(dir / "run.yaml");
  ASSERT_EQ(original.sources.size(), 2u);
  EXPECT_EQ(original.sources[1].weight, 1.0) << "the default weight";
  write_text(dir / "dumped.yaml", config_to_yaml(original));
  const Config reloaded = load_config(dir / "dumped.yaml");
  EXPECT_EQ(reloaded.sources, original.sources);
  EXPECT_EQ(reloaded.sources[1].name, "odd: 'code' #1");

  const std::string entry = "{name: a, train: t, val: v}";
  EXPECT_CONTAINS(config_error("data:\n  sources: {name: a}\n"), "data.sources must be a list");
  EXPECT_CONTAINS(config_error("data:\n  sources: [{train: t, val: v}]\n"),
                  "data.sources entry 1: no name");
  EXPECT_CONTAINS(config_error("data:\n  sources: [" + entry + ", {name: a, train: u, val: w}]\n"),
                  "data.sources entry 2: the name a is given twice");
  EXPECT_CONTAINS(config_error("data:\n  sources: [{name: a, train: t, val: v, weight: -1}]\n"),
                  "data.sources entry 1 (a): weight must be a finite number of at least 0, got -1");
  EXPECT_CONTAINS(config_error("data:\n  sources: [{name: a, train: t, val: v, weight: 0}]\n"),
                  "every weight of data.sources is 0");
  // Each finite, their sum is not: each share would be 0 of infinity.
  EXPECT_CONTAINS(config_error("data:\n  sources: [{name: a, train: t, val: v, weight: 1e308}, "
                               "{name: b, train: u, val: w, weight: 1e308}]\n"),
                  "the weights of data.sources add up to more than a double holds");
  EXPECT_CONTAINS(config_error("data:\n  sources: [{name: a, train: t, val: v, wieght: 1}]\n"),
                  "data.sources entry 1: unknown key wieght");
  EXPECT_CONTAINS(config_error("data:\n  sources: [{name: a, train: t, val: v, weight: lots}]\n"),
                  "weight must be a number, got lots");
  // A repeated key would be read once, silently: a second weight of 0 once paused a source.
  EXPECT_CONTAINS(config_error("data:\n  sources:\n    - {name: a, train: t, val: v, weight: 1}\n"
                               "    - name: b\n      train: u\n      val: w\n      weight: 1\n"
                               "      weight: 0\n"),
                  "data.sources entry 2: weight is given twice: keep one");
  EXPECT_CONTAINS(config_error("", {"data.sources=[{name: a, name: b, train: t, val: v}]"}),
                  "data.sources entry 1: name is given twice: keep one");
  // Names and paths go into JSON and YAML files, which hold Unicode text only: a name of other
  // bytes once failed every checkpoint save and evaluation record with nlohmann's raw text.
  EXPECT_CONTAINS(config_error("data:\n  sources: [{name: \"web\xFF\", train: t, val: v}]\n"),
                  "data.sources entry 1: name is not valid UTF-8 (\"web\\xFF\", byte 4)");
  EXPECT_CONTAINS(config_error("", {"data.sources=[{name: a, train: \"t\xC0\xAF\", val: v}]"}),
                  "data.sources entry 1: train is not valid UTF-8");
  EXPECT_CONTAINS(config_error("", {"train.run_dir=runs/\xE9t\xE9"}),
                  "--set train.run_dir=runs/\xE9t\xE9: train.run_dir is not valid UTF-8 "
                  "(\"runs/\\xE9t\\xE9\", byte 6)");
  EXPECT_EQ(config_error("data:\n  train: x.bin\n  sources: [" + entry + "]\n"), "")
      << "a config for one corpus takes data.sources over it";
}

// dist.overlap was a bool before it took auto: a config saved then (overlap: true, unquoted)
// still loads, and a value outside the three is refused by name.
TEST(Config, DistOverlapTakesAutoAndTheBoolsOfOlderConfigs) {
  TemporaryDirectory dir;
  write_text(dir / "old.yaml", "dist:\n  overlap: true\n");
  EXPECT_EQ(load_config(dir / "old.yaml").dist.overlap, "true");
  EXPECT_EQ(load_config(dir / "old.yaml", {"dist.overlap=auto"}).dist.overlap, "auto");
  EXPECT_CONTAINS(config_error("dist:\n  overlap: yes\n"),
                  "dist.overlap must be one of auto, true, false, got \"yes\"");
}

// model.init_from is read and written in the model section like the keys of ModelConfig, though
// Config holds it outside ModelConfig.
TEST(Config, InitFromIsAModelKeyThatDefaultsToNone) {
  EXPECT_EQ(Config{}.init_from, "");
  TemporaryDirectory dir;
  write_text(dir / "run.yaml", "model:\n  init_from: hf/llama\n  d_model: 256\n");
  const Config config = load_config(dir / "run.yaml");
  EXPECT_EQ(config.init_from, "hf/llama");
  EXPECT_EQ(config.model.d_model, 256);
  const std::string dumped = config_to_yaml(config);
  EXPECT_CONTAINS(dumped, "  init_from: \"hf/llama\"\n");
  write_text(dir / "dumped.yaml", dumped);
  EXPECT_EQ(load_config(dir / "dumped.yaml").init_from, "hf/llama");
  EXPECT_EQ(load_config(dir / "run.yaml", {"model.init_from="}).init_from, "");
  EXPECT_CONTAINS(config_error("", {"model.model_name_or_path=x"}),
                  "(mltrain calls it model.init_from)");
}

TEST(Config, ShippedConfigsLoad) {
  const Config base = load_config(MLTRAIN_SOURCE_DIR "/configs/base.yaml");
  EXPECT_EQ(base.data.micro_batch * base.data.grad_accum * base.data.seq_len * 8, 524'288)
      << "base.yaml is a global batch of about 0.5M tokens on 8 GPUs";
}

// The README resumes the smoke run from a checkpoint by name: the smoke config must save it.
TEST(Config, TheReadmesSmokeCheckpointIsOneTheSmokeRunSaves) {
  const std::string readme = testing::read_text(MLTRAIN_SOURCE_DIR "/README.md");
  const std::string prefix = "--resume runs/smoke/checkpoints/step_";
  const size_t at = readme.find(prefix);
  ASSERT_NE(at, std::string::npos);
  const int64_t step = std::stoll(readme.substr(at + prefix.size(), 8));
  const Config smoke = load_config(MLTRAIN_SOURCE_DIR "/configs/smoke.yaml");
  EXPECT_EQ(step % smoke.train.ckpt_every, 0) << step;
  EXPECT_LT(step, smoke.train.max_steps) << "the last checkpoint is no example of resuming";
  // The rolling window keeps it to the end of the run.
  EXPECT_GE(smoke.train.keep_last, smoke.train.max_steps / smoke.train.ckpt_every);
}

TEST(Config, ReadmeListsEveryKeyWithItsDefault) {
  const std::string readme = testing::read_text(MLTRAIN_SOURCE_DIR "/configs/README.md");
  EXPECT_NE(readme.find(config_reference_markdown()), std::string::npos)
      << "configs/README.md is out of date; its key table must be:\n"
      << config_reference_markdown();
}

}  // namespace
}  // namespace mltrain
