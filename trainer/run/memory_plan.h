#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "model/layers/model_config.h"
#include "trainer/config/config.h"

namespace mltrain {

// Where a plan is for: how many ranks, on which kind of device, in which precision, and one
// rank's share of the device's memory when known.
struct PlanTarget {
  int ranks = 1;
  bool cuda = false;
  bool bf16 = false;
  std::optional<double> device_memory;  // bytes
};

// What one rank of a run will hold, in bytes, counted from the config before anything is
// allocated. Bytes are counted in double: a config that a slip makes absurd (data.micro_batch in
// the quintillions) is planned, shown and refused like any other, instead of overflowing. The
// weights, gradients and optimizer state are closed forms that the tests hold against the tensors;
// the activations and working memory, closed forms of what the autograd graph keeps, which the
// tests hold against the bytes the CPU allocator hands out on both of the CPU's paths (mltrain's
// kernels, and the ATen compositions that CUDA runs too); on CUDA they are estimates, which
// tests/gpu/memory_plan_cuda_test.cpp holds against the CUDA allocator (not run on a GPU yet).
struct MemoryPlan {
  int64_t parameters = 0;
  double trained = 0;  // the parameters that train: all of them, or LoRA's adapters alone
  PlanTarget target;
  int shard_ranks = 1;             // the ranks that what is sharded is cut among (dist.shard_ranks)
  bool sharded = false;            // dist.zero_stage 1, 2 or 3: the optimizer state
  bool gradients_sharded = false;  // dist.zero_stage 2 or 3: the gradients too
  bool weights_sharded = false;    // dist.zero_stage 3: the weights too
  bool muon = false;  // optim.name muon: a momentum per block matrix, AdamW's moments of the rest
  bool activation_checkpointing = false;
  double runtime = 0;  // the libraries, the CUDA context and buffers: an estimate
  // fp32 master weights (sharded: this rank's part, and the units whole at once, in bf16 under
  // bf16), and the rotary tables
  double weights = 0;
  // fp32 buckets, this rank's averaged part when sharded, bf16 wire copies; with the gradients
  // sharded, the part and the buckets in use
  double gradients = 0;
  double optimizer = 0;  // the optimizer's state (AdamW's two moments) at the configured zero_stage
  double optimizer_unsharded = 0;       // the same at zero_stage 0
  double optimizer_sharded = 0;         // the same at zero_stage 1, cut among shard_ranks ranks
  double activations = 0;               // kept for backward, per micro-batch, as configured
  double activations_kept_all = 0;      // without activation checkpointing
  double activations_checkpointed = 0;  // with it
  double working = 0;                   // working_bytes
  // Host memory that saving and resuming a checkpoint take, outside the total: for a moment, or
  // with async_checkpoint for as long as the run trains.
  double checkpoint_host = 0;
  bool async_checkpoint = false;     // train.async_checkpoint
  bool state_read_in_parts = false;  // a sharded AdamW state: each rank reads its part

  // Sharded weights (dist.zero_stage 3): what the set-up and a rollback's load hold beyond the
  // weights line while they fill the weights a unit at a time, when no activation is held.
  double unit_filled = 0;

  double total() const {
    return runtime + weights + gradients + optimizer + std::max(activations + working, unit_filled);
  }
  bool fits() const { return !target.device_memory || total() <= *target.device_memory; }
};

// How a run computes, as far as its memory goes.
struct ComputePath {
  bool bf16 = false;
  // mltrain's fused layers (train.kernels auto on a CPU that runs them, fused_cuda on CUDA); else
  // the ATen compositions. What the fused layers keep was measured on the CPU; on CUDA the same
  // count is assumed, until the GPU test measures it.
  bool fused_layers = true;
  // mltrain's chunked loss (the CPU's); else the whole logits.
  bool chunked_loss = true;
  // mltrain's CUDA cross-entropy (train.kernels fused_cuda): the logits kept in their dtype, with
  // no fp32 log-softmax, and their gradient written over them; else, without the chunked loss,
  // ATen's.
  bool cuda_loss = false;
  bool repeated_kv = false;  // attention repeats keys and values to every query head (fp32 CUDA)
  // Under bf16, autocast casts the fp32 weights and keeps the casts; ZeRO-3 gathers its units in
  // bf16 instead (dist/unit_shards.h), which autocast then takes as they are.
  bool casts_weights = false;
  // data.document_masking: what the packed documents add per token, held from forward through
  // backward by every layer at once: each token's rotary rows (cos and sin) and position,
  // and its row of the [B, 1, T, T] mask (none for variable-length flash, CUDA in bf16).
  int64_t document_bytes_per_token = 0;
};
ComputePath compute_path(const Config& config, const PlanTarget& target);

// The bytes the autograd graph of one micro-batch of `tokens` tokens (micro_batch x seq_len) keeps
// for backward: every block's saved inputs of its products, norms, attention and SwiGLU, and the
// loss's; with checkpointing, each block's input alone.
double activation_bytes(const ModelConfig& model, int64_t tokens, const ComputePath& path,
                        bool activation_checkpointing);

// How many ranks what a run of `config` on `ranks` ranks shards is cut among: dist.shard_ranks
// (hybrid sharding), or every rank. A UserError where dist.shard_ranks does not divide `ranks`.
int shard_group_size(const Config& config, int ranks);
// Whether a run of `config` on `ranks` ranks shards its optimizer: dist.zero_stage 1 with more
// than one rank to a group (one rank has nothing to share the state with).
bool shards_optimizer(const Config& config, int ranks);
// Whether it shards its gradients too: dist.zero_stage 2 or 3 with more than one rank.
bool shards_gradients(const Config& config, int ranks);
// Whether it shards its weights too: dist.zero_stage 3 with more than one rank.
bool shards_weights(const Config& config, int ranks);

// The most a step holds besides the activations: the weights' bf16 casts, the loss's buffers (the
// chunked loss's weight gradient, or the gradients of the whole logits), a recomputed block, the
// packed documents' tables and mask.
double working_bytes(const ModelConfig& model, int64_t tokens, const ComputePath& path,
                     bool activation_checkpointing);

// The plan of a run of `config` on `target`.
MemoryPlan plan_memory(const Config& config, const PlanTarget& target);

// The plan as a table for the log: each part, with and without ZeRO-1 and checkpointing, the
// total against the device's memory.
std::string describe(const MemoryPlan& plan);

// What the plan gives at each dist.zero_stage on `target`, whether each fits, and the lowest that
// does (the least communication); empty for one rank or a device of unknown memory.
std::string describe_stages(const Config& config, const PlanTarget& target);

// Why the plan does not fit its device's memory, and what would make it fit: ZeRO-1, activation
// checkpointing, a smaller micro-batch with more accumulation; empty when it fits.
std::string memory_shortfall(const MemoryPlan& plan, const Config& config);

}  // namespace mltrain
