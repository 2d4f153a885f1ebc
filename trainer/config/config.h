#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace mltrain {

struct DataConfig {
  std::string train = "data/shards/train_*.bin";
  std::string val = "data/shards/val_*.bin";
  std::string tokenizer = "data/shards/tokenizer.model";
  int64_t seq_len = 1024;
  int64_t micro_batch = 16;
  int64_t grad_accum = 4;
  int64_t seed = 1337;
  int64_t prefetch = 2;
};

struct OptimConfig {
  double lr = 6.0e-4;
  double min_lr = 6.0e-5;
  int64_t warmup_steps = 200;
  std::string schedule = "cosine";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  double decay_fraction = 0.2;
};

struct TrainConfig {
  int64_t max_steps = 10000;
  std::string precision = "auto";
  std::string kernels = "fused";
  std::string device = "auto";
  int64_t threads = 0;
  std::string run_dir = "runs/base";
  int64_t log_every = 10;
  int64_t eval_every = 500;
  int64_t eval_batches = 20;
  int64_t ckpt_every = 1000;
  int64_t keep_last = 3;
  int64_t keep_every = 0;
  int64_t stop_at = 0;
  int64_t max_bad_steps = 5;
  bool activation_checkpointing = false;
  bool check_memory = true;
};

struct DistConfig {
  std::string backend = "auto";
  double bucket_mb = 25.0;
  std::string overlap = "auto";
  std::string grad_dtype = "fp32";
  int64_t zero_stage = 0;
  int64_t timeout_s = 600;
};

// Everything a run is configured by: defaults, then a YAML file, then --set overrides.
struct Config {
  ModelConfig model;
  // model.init_from: a Hugging Face LLaMA directory whose weights a fresh run starts from (empty:
  // seeded initial weights). Kept out of ModelConfig, which is what the model computes; where its
  // weights come from is the run's business.
  std::string init_from;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  DistConfig dist;
};

// Loads `file` over the defaults and applies `overrides` ("section.key=value", later ones win).
// An unknown key (with the nearest valid key), a value of the wrong type, out of range or
// inconsistent with another is a UserError naming the file (and line) or the override.
Config load_config(const std::filesystem::path& file,
                   const std::vector<std::string>& overrides = {});

// The effective config as YAML that load_config reads back to the same Config.
std::string config_to_yaml(const Config& config);

// A key whose value differs between two configs, with both values as YAML shows them.
struct ConfigChange {
  std::string key;
  std::string before;
  std::string after;
};
std::vector<ConfigChange> config_changes(const Config& before, const Config& after);

// The table of every key, its default and its description, as configs/README.md shows it.
std::string config_reference_markdown();

}  // namespace mltrain
