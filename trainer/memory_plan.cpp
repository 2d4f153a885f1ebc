#include "trainer/memory_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "common/error.h"

namespace mltrain {
namespace {

constexpr double kGB = 1e9;
// What the process holds before training allocates: the libraries' code and data on the CPU; the
// CUDA context, cuBLAS's workspaces and NCCL's buffers on a GPU. Estimates.
constexpr int64_t kCpuRuntimeBytes = 500'000'000;
constexpr int64_t kCudaRuntimeBytes = 1'000'000'000;

// Bytes one block keeps for backward per token, as the autograd graph holds them.
int64_t block_bytes_per_token(const ModelConfig& model, bool bf16) {
  const int64_t d = model.d_model;
  const int64_t q = model.n_q_heads * model.head_dim;
  const int64_t kv = model.n_kv_heads * model.head_dim;
  const int64_t f = model.d_ffn;
  const int64_t statistics = 4 * (2 + model.n_q_heads);  // two norms' rstd, attention's logsumexp
  if (!bf16) {
    // fp32: the two norms' inputs and outputs (4d); q, k and v as attention saves them, and its
    // output, which wo reads as it is (2q + 2kv); SwiGLU's gate and up, and its output (3f).
    return 4 * (4 * d + 2 * q + 2 * kv + 3 * f) + statistics;
  }
  // bf16 autocast: the residual stream and the norms' inputs stay fp32 (2 x 4d); each product
  // keeps its own bf16 cast of its input: three of the attention norm's output, two of the
  // feed-forward norm's (5 x 2d); q, k, v and the attention output in bf16 (2 x (2q + 2kv));
  // gate, up and SwiGLU's output in bf16 (3 x 2f).
  return 8 * d + 10 * d + 2 * (2 * q + 2 * kv) + 6 * f + statistics;
}

// Bytes per token outside the blocks: the final norm's input and output, and the loss's
// per-token statistics.
int64_t head_bytes_per_token(const ModelConfig& model) { return 8 * model.d_model + 8; }

std::string gb(int64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / kGB); }

}  // namespace

int64_t activation_bytes(const ModelConfig& model, int64_t tokens, bool bf16,
                         bool activation_checkpointing) {
  // With checkpointing each block keeps only its input, the fp32 residual stream.
  const int64_t per_block =
      activation_checkpointing ? 4 * model.d_model : block_bytes_per_token(model, bf16);
  return tokens * (model.n_layers * per_block + head_bytes_per_token(model));
}

int64_t working_bytes(const ModelConfig& model, int64_t tokens, bool chunked_loss, bool bf16,
                      bool activation_checkpointing) {
  int64_t bytes = 0;
  // Without checkpointing, the products keep the bf16 casts of their weights for backward.
  if (bf16 && !activation_checkpointing) bytes += 2 * model.parameters();
  // The chunked loss computes the output weight's gradient in forward, in fp32; without it the
  // logits in bf16 and fp32, the log-softmax and their gradients take about 12 bytes per token
  // and word of the vocabulary.
  bytes += chunked_loss ? 4 * model.vocab_size * model.d_model : 12 * tokens * model.vocab_size;
  return bytes;
}

bool shards_optimizer(const Config& config, int ranks) {
  return config.dist.zero_stage == 1 && ranks > 1;
}

MemoryPlan plan_memory(const Config& config, const PlanTarget& target) {
  const ModelConfig& model = config.model;
  const int64_t ranks = target.ranks;
  const bool bf16 = target.bf16;
  MemoryPlan plan;
  plan.parameters = model.parameters();
  plan.target = target;
  plan.sharded = shards_optimizer(config, target.ranks);
  plan.activation_checkpointing = config.train.activation_checkpointing;

  const int64_t values = plan.parameters;
  // Sharded, each bucket pads to a multiple of the ranks: at most a bucket's worth of rounding,
  // which is negligible here.
  const int64_t part = (values + ranks - 1) / ranks;
  plan.runtime = target.cuda ? kCudaRuntimeBytes : kCpuRuntimeBytes;
  plan.weights = 4 * values;
  plan.gradients = 4 * values + (plan.sharded ? 4 * part : 0);
  plan.optimizer_unsharded = 8 * values;
  plan.optimizer_sharded = 8 * part;
  plan.optimizer = plan.sharded ? plan.optimizer_sharded : plan.optimizer_unsharded;

  const int64_t tokens = config.data.micro_batch * config.data.seq_len;
  plan.activations_kept_all = activation_bytes(model, tokens, bf16, false);
  plan.activations_checkpointed = activation_bytes(model, tokens, bf16, true);
  plan.activations =
      plan.activation_checkpointing ? plan.activations_checkpointed : plan.activations_kept_all;

  plan.working = working_bytes(model, tokens, config.train.kernels == "fused" && !target.cuda, bf16,
                               plan.activation_checkpointing) +
                 (plan.activation_checkpointing ? tokens * block_bytes_per_token(model, bf16) : 0);
  return plan;
}

std::string describe(const MemoryPlan& plan) {
  std::string text = fmt::format(
      "memory plan per rank ({} parameters, {} rank{} on {}, {}):\n", plan.parameters,
      plan.target.ranks, plan.target.ranks == 1 ? "" : "s", plan.target.cuda ? "CUDA" : "the CPU",
      plan.target.bf16 ? "bf16 autocast" : "fp32");
  const auto line = [&](const char* part, int64_t bytes, const std::string& note) {
    std::string row = fmt::format("  {:<34} {:>10}   {}", part, gb(bytes), note);
    row.erase(row.find_last_not_of(' ') + 1);
    text += row + "\n";
  };
  line("runtime (libraries, buffers)", plan.runtime, "an estimate");
  line("weights (fp32)", plan.weights, "");
  line("gradients (fp32 buckets)", plan.gradients,
       plan.sharded ? "and this rank's averaged part" : "");
  line("optimizer state (AdamW moments)", plan.optimizer,
       fmt::format("dist.zero_stage 0: {}, 1: {} at {} ranks", gb(plan.optimizer_unsharded),
                   gb(plan.optimizer_sharded), plan.target.ranks));
  line("activations per micro-batch", plan.activations,
       fmt::format("train.activation_checkpointing false: {}, true: {}",
                   gb(plan.activations_kept_all), gb(plan.activations_checkpointed)));
  line("working (casts, logits, recompute)", plan.working, "");
  if (plan.target.device_memory) {
    line("total", plan.total(),
         fmt::format("of {} per rank: {}", gb(*plan.target.device_memory),
                     plan.fits() ? "fits" : "does NOT fit"));
  } else {
    line("total", plan.total(), "(the device's memory is not known)");
  }
  text.pop_back();  // the caller ends the last line
  return text;
}

void check_fits(const MemoryPlan& plan, const Config& config) {
  if (plan.fits()) return;
  // Each remedy alone, then both, then the largest micro-batch that fits as configured.
  std::vector<std::string> remedies;
  const auto fits_with = [&](Config changed) { return plan_memory(changed, plan.target).fits(); };
  Config sharded = config;
  sharded.dist.zero_stage = 1;
  Config checkpointed = config;
  checkpointed.train.activation_checkpointing = true;
  Config both = sharded;
  both.train.activation_checkpointing = true;
  if (!plan.sharded && plan.target.ranks > 1 && fits_with(sharded))
    remedies.push_back("dist.zero_stage=1");
  if (!plan.activation_checkpointing && fits_with(checkpointed))
    remedies.push_back("train.activation_checkpointing=true");
  if (remedies.empty() && plan.target.ranks > 1 && fits_with(both))
    remedies.push_back("dist.zero_stage=1 with train.activation_checkpointing=true");
  for (int64_t micro_batch = config.data.micro_batch - 1; micro_batch >= 1; --micro_batch) {
    Config smaller = config;
    smaller.data.micro_batch = micro_batch;
    if (fits_with(smaller)) {
      remedies.push_back(
          fmt::format("data.micro_batch={} (with data.grad_accum raised to keep the global batch)",
                      micro_batch));
      break;
    }
  }
  throw UserError(fmt::format(
      "the memory plan needs {} per rank but a rank has {}: {} (see --dry-run for the plan)",
      gb(plan.total()), gb(*plan.target.device_memory),
      remedies.empty() ? std::string("nothing in the config makes it fit: more ranks with "
                                     "dist.zero_stage=1, or a smaller model")
                       : "it would fit with " + fmt::format("{}", fmt::join(remedies, ", or "))));
}

}  // namespace mltrain
