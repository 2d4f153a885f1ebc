#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/layers/lora_config.h"
#include "model/layers/model_config.h"

namespace mltrain {

// The keys of each section, each declared once: KEY(section, type, name, default, doc line,
// check). The section's struct below is made from its list, and config.cpp reads, checks, writes
// and documents the keys from the same lists; the checks (at_least, between, one_of, or {} for
// none) are config.cpp's. The model's keys are model/layers/model_config.h's.
#define MLTRAIN_DATA_KEYS(KEY, S)                                                              \
  KEY(S, std::string, train, "data/shards/train_*.bin", "glob of training token shards", {})   \
  KEY(S, std::string, val, "data/shards/val_*.bin", "glob of validation token shards", {})     \
  KEY(S, std::string, tokenizer, "data/shards/tokenizer.model",                                \
      "SentencePiece model of the shards (empty: none)", {})                                   \
  KEY(S, int64_t, seq_len, 1024, "tokens per training sequence (<= model.max_seq_len)",        \
      at_least(1))                                                                             \
  KEY(S, int64_t, micro_batch, 16, "sequences per rank per forward pass", at_least(1))         \
  KEY(S, int64_t, grad_accum, 4, "micro-steps accumulated per optimizer step", at_least(1))    \
  KEY(S, int64_t, seed, 1337, "seed of the sample order and the initial weights", at_least(0)) \
  KEY(S, int64_t, prefetch, 2, "batches the loader keeps ready", at_least(1))                  \
  KEY(S, bool, document_masking, false,                                                        \
      "attention within documents only, positions restarting at each (documents begin at the " \
      "end-of-document token)",                                                                \
      {})                                                                                      \
  KEY(S, int64_t, eot_token, -1,                                                               \
      "end-of-document token id for document masking (-1: the tokenizer's)", at_least(-1))

#define MLTRAIN_OPTIM_KEYS(KEY, S)                                                                 \
  KEY(S, std::string, name, "adamw",                                                               \
      "optimizer of the blocks' matrices: adamw, or muon (the embedding and the norms stay on "    \
      "AdamW)",                                                                                    \
      one_of({"adamw", "muon"}))                                                                   \
  KEY(S, double, lr, 6.0e-4, "peak learning rate (of AdamW)", at_least(0))                         \
  KEY(S, double, min_lr, 6.0e-5, "learning rate at the end of the decay", at_least(0))             \
  KEY(S, int64_t, warmup_steps, 200, "steps of linear warmup (<= train.max_steps)", at_least(0))   \
  KEY(S, std::string, schedule, "cosine", "learning-rate schedule after warmup",                   \
      one_of({"cosine", "constant", "linear", "wsd"}))                                             \
  KEY(S, double, beta1, 0.9, "AdamW first-moment decay", at_least_and_below(0, 1))                 \
  KEY(S, double, beta2, 0.95, "AdamW second-moment decay", at_least_and_below(0, 1))               \
  KEY(S, double, eps, 1.0e-8, "AdamW epsilon", at_least(0))                                        \
  KEY(S, double, weight_decay, 0.1, "decoupled weight decay of matrices (not norms)", at_least(0)) \
  KEY(S, double, grad_clip, 1.0, "clip the global gradient norm to this (0: off)", at_least(0))    \
  KEY(S, double, decay_fraction, 0.2, "share of all steps the wsd schedule decays over",           \
      between(0, 1))                                                                               \
  KEY(S, double, muon_lr, 0.0,                                                                     \
      "peak learning rate of Muon's matrices, which the schedule scales as it scales lr (0: lr, "  \
      "which Muon's update scale carries over)",                                                   \
      at_least(0))                                                                                 \
  KEY(S, double, muon_momentum, 0.95, "Muon's Nesterov momentum", at_least_and_below(0, 1))        \
  KEY(S, int64_t, muon_ns_steps, 5, "Newton-Schulz iterations of each Muon update", between(1, 100))

#define MLTRAIN_TRAIN_KEYS(KEY, S)                                                               \
  KEY(S, int64_t, max_steps, 10000, "optimizer steps of the run", at_least(1))                   \
  KEY(S, std::string, precision, "auto",                                                         \
      "auto (bf16 where it is faster than fp32: CUDA, CPUs with AMX-BF16; else fp32), bf16 "     \
      "(autocast, fp32 master weights) or fp32",                                                 \
      one_of({"auto", "bf16", "fp32"}))                                                          \
  KEY(S, std::string, kernels, "auto",                                                           \
      "auto (mltrain's kernels on the CPU, ATen on CUDA; fused is the same), fused_cuda "        \
      "(mltrain's kernels on both, the CUDA ones not yet run on a GPU) or aten (the plain ATen " \
      "layers)",                                                                                 \
      one_of({"auto", "fused", "fused_cuda", "aten"}))                                           \
  KEY(S, std::string, device, "auto", "auto (CUDA when present), cpu or cuda",                   \
      one_of({"auto", "cpu", "cuda"}))                                                           \
  KEY(S, int64_t, threads, 0, "CPU intra-op threads (0: all cores)", between(0, 1024))           \
  KEY(S, bool, tf32, true,                                                                       \
      "fp32 matrix products on CUDA in TF32 (tensor cores, 10-bit mantissa inputs, fp32 "        \
      "accumulation); false: full fp32. No effect on the CPU or under bf16",                     \
      {})                                                                                        \
  KEY(S, std::string, run_dir, "runs/base",                                                      \
      "directory of metrics, config and checkpoints, owned by one training run at a time "       \
      "(RUN_DIR/run.lock)",                                                                      \
      {})                                                                                        \
  KEY(S, int64_t, log_every, 10, "steps between progress lines", at_least(1))                    \
  KEY(S, int64_t, eval_every, 500, "steps between validations", at_least(1))                     \
  KEY(S, int64_t, eval_batches, 20, "validation batches per evaluation (0: all)", at_least(0))   \
  KEY(S, int64_t, ckpt_every, 1000, "steps between checkpoints", at_least(1))                    \
  KEY(S, int64_t, keep_last, 3,                                                                  \
      "checkpoints kept on a rolling basis (and the newest one a later step confirms good)",     \
      at_least(1))                                                                               \
  KEY(S, int64_t, keep_every, 0,                                                                 \
      "checkpoints at multiples of this step are kept for good (0: none)", at_least(0))          \
  KEY(S, bool, async_checkpoint, false,                                                          \
      "copy a checkpoint's state to host memory and write it on a background thread while "      \
      "training goes on (each rank holds a copy of what it writes: rank 0 the weights and the "  \
      "optimizer state where they are not sharded, under ZeRO each rank its own parts)",         \
      {})                                                                                        \
  KEY(S, int64_t, stop_at, 0,                                                                    \
      "stop with a checkpoint once this many steps are done, to resume later (0: run to "        \
      "max_steps)",                                                                              \
      at_least(0))                                                                               \
  KEY(S, int64_t, max_bad_steps, 5,                                                              \
      "skipped steps in a row (non-finite, or loss spikes) before the run rolls back to a good " \
      "checkpoint",                                                                              \
      at_least(1))                                                                               \
  KEY(S, double, spike_guard, 2.0,                                                               \
      "skip a step whose loss exceeds this many times the running level of the steps before "    \
      "(0: off)",                                                                                \
      at_least(0))                                                                               \
  KEY(S, bool, activation_checkpointing, false,                                                  \
      "keep only each block's input in forward and recompute the block in backward: activation " \
      "memory falls several times (8x on a 297M model) for one more forward pass of the "        \
      "blocks",                                                                                  \
      {})                                                                                        \
  KEY(S, std::string, cpu_memory, "resident",                                                    \
      "what the peak memory logged on the CPU counts: resident (the process's peak resident "    \
      "set: the libraries too, and blocks freed but not returned) or allocator (the bytes of "   \
      "the tensors LibTorch's CPU allocator holds, counted through a wrapper around it: what "   \
      "the memory plan counts)",                                                                 \
      one_of({"resident", "allocator"}))                                                         \
  KEY(S, bool, check_memory, true,                                                               \
      "refuse to start a run whose memory plan exceeds the device's memory (false: warn and "    \
      "start)",                                                                                  \
      {})                                                                                        \
  KEY(S, bool, tensorboard, false,                                                               \
      "write the logged scalars (loss, lr, gradient norm, tokens/s, MFU or GFLOP/s, peak "       \
      "memory, validation loss) as TensorBoard event files in RUN_DIR/tensorboard/",             \
      {})                                                                                        \
  KEY(S, std::string, profile_steps, "",                                                         \
      "steps to trace with torch's profiler, FIRST-LAST (e.g. 20-22): a Chrome trace in "        \
      "RUN_DIR/profile/ and a table of the costliest operations (empty: none)",                  \
      {})

#define MLTRAIN_DIST_KEYS(KEY, S)                                                                  \
  KEY(S, std::string, backend, "auto",                                                             \
      "auto (NCCL on CUDA; on the CPU MPI under an MPI launcher, else Gloo), nccl or mpi",         \
      one_of({"auto", "nccl", "mpi"}))                                                             \
  KEY(S, double, bucket_mb, 25.0, "gradient all-reduce bucket size in MiB", at_least(0.001))       \
  KEY(S, std::string, overlap, "auto",                                                             \
      "all-reduce buckets while backward runs: auto (on CUDA, not on the CPU, where MPI "          \
      "makes no progress meanwhile), true or false",                                               \
      one_of({"auto", "true", "false"}))                                                           \
  KEY(S, std::string, grad_dtype, "fp32", "dtype of the gradient all-reduce",                      \
      one_of({"fp32", "bf16"}))                                                                    \
  KEY(S, int64_t, zero_stage, 0,                                                                   \
      "0: every rank holds the whole optimizer state; 1 (ZeRO-1): each rank holds and updates "    \
      "1/N of it, gradients are reduce-scattered and the weights all-gathered; 2 (ZeRO-2): as 1, " \
      "and each rank keeps only its 1/N of the gradients, every micro-step reduce-scattered as "   \
      "backward completes each bucket (AdamW only); 3 (ZeRO-3): as 2, and each rank keeps only "   \
      "its 1/N of the weights, each block's (and the embedding's and the head's) all-gathered "    \
      "just before it runs forward or backward and freed after (AdamW only)",                      \
      between(0, 3))                                                                               \
  KEY(S, int64_t, shard_ranks, 0,                                                                  \
      "with dist.zero_stage 1, 2 or 3, how many ranks share one copy of what is sharded: groups "  \
      "of this many consecutive ranks (a node's) each hold a whole replica, cut among them, and "  \
      "average their gradients across the groups (hybrid sharding, HSDP); it must divide the "     \
      "ranks. 0: all of them, one group",                                                          \
      at_least(0))                                                                                 \
  KEY(S, int64_t, timeout_s, 600,                                                                  \
      "seconds before a stuck collective is an error naming the ranks behind (RUN_DIR/flight); "   \
      "at most a week, so that its deadlines in milliseconds never overflow",                      \
      between(1, 604800))                                                                          \
  KEY(S, std::string, rendezvous, "tcp",                                                           \
      "where ranks started without MPI (torchrun, srun) meet: tcp (a store that rank 0 serves at " \
      "MASTER_ADDR:MASTER_PORT, under srun the first node) or file:PATH (a file on a "             \
      "filesystem every rank shares, left by no earlier run)",                                     \
      {})

struct DataConfig {
  MLTRAIN_DATA_KEYS(MLTRAIN_CONFIG_FIELD, data)
};

struct OptimConfig {
  MLTRAIN_OPTIM_KEYS(MLTRAIN_CONFIG_FIELD, optim)
};

struct TrainConfig {
  MLTRAIN_TRAIN_KEYS(MLTRAIN_CONFIG_FIELD, train)
};

struct DistConfig {
  MLTRAIN_DIST_KEYS(MLTRAIN_CONFIG_FIELD, dist)
};

// Steps FIRST to LAST, both included.
struct StepRange {
  int64_t first = 0;
  int64_t last = 0;
};

// train.profile_steps as a range, none when empty. Text that is not FIRST-LAST with
// 1 <= FIRST <= LAST is a UserError (load_config refuses it).
std::optional<StepRange> profile_step_range(const std::string& text);

// One corpus of data.sources: its name (in logs, metrics and checkpoints), the globs of its
// training and validation shards, and its weight (a source's share of the training samples is its
// weight over the sum).
struct DataSource {
  std::string name;
  std::string train;
  std::string val;
  double weight = 1.0;
  bool operator==(const DataSource&) const = default;
};

// Everything a run is configured by: defaults, then a YAML file, then --set overrides.
struct Config {
  ModelConfig model;
  // model.init_from: a Hugging Face LLaMA directory whose weights a fresh run starts from (empty:
  // seeded initial weights). Kept out of ModelConfig, which is what the model computes; where its
  // weights come from is the run's business. Its doc line and check are config.cpp's, the one key
  // outside the lists.
  std::string init_from;
  DataConfig data;
  // data.sources: the corpora to blend; empty, the one corpus of data.train and data.val. A list,
  // kept out of DataConfig's scalar keys; its doc line, reading and writing are
  // config/data_sources.h's.
  std::vector<DataSource> sources;
  OptimConfig optim;
  TrainConfig train;
  DistConfig dist;
  // lora: the model's low-rank adapters (model/layers/lora_config.h), which alone train.
  LoraConfig lora;
};

// Loads `file` over the defaults and applies `overrides` ("section.key=value", later ones win).
// An unknown key (with the nearest valid key), a value of the wrong type, out of range or
// inconsistent with another is a UserError naming the file (and line) or the override.
Config load_config(const std::filesystem::path& file,
                   const std::vector<std::string>& overrides = {});

// The effective config as YAML that load_config reads back to the same Config.
std::string config_to_yaml(const Config& config);

// `config` with the paths it reads from (data.train, data.val, data.tokenizer, model.init_from)
// made absolute against the working directory: the form a run saves, so that the config saved
// with a run means the same files from any directory, and after the run directory has moved. A
// data.tokenizer with nothing there (the default, for shards made elsewhere) is saved empty: the
// run has none.
Config with_absolute_data_paths(Config config);

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
