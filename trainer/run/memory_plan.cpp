#include "trainer/run/memory_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "common/error.h"
#include "model/kernels/cpu_kernels.h"
#include "model/kernels/kernels.h"
#include "model/layers/document_attention.h"

namespace mltrain {
namespace {

constexpr double kGB = 1e9;
// What the process holds before training allocates: the libraries' code and data on the CPU; the
// CUDA context, cuBLAS's workspaces and NCCL's buffers on a GPU. Estimates.
constexpr double kCpuRuntimeBytes = 500'000'000;
constexpr double kCudaRuntimeBytes = 1'000'000'000;

// Bytes one block keeps for backward per token, as the autograd graph holds them.
int64_t block_bytes_per_token(const ModelConfig& model, const ComputePath& path) {
  const int64_t d = model.d_model;
  const int64_t q = model.n_q_heads * model.head_dim;
  const int64_t kv = model.n_kv_heads * model.head_dim;
  const int64_t f = model.d_ffn;
  const int64_t statistics = 4 * (2 + model.n_q_heads);  // two norms' rstd, attention's logsumexp
  // Both: the rotated q, k and v (one tensor) and the attention output, which wo reads as it is
  // (2q + 2kv); where attention takes keys and values repeated to every query head, those copies
  // too (2q), while its query, a view, keeps the rotated tensor whole.
  const int64_t attention = 2 * q + 2 * kv + (path.repeated_kv ? 2 * q : 0);
  if (!path.bf16) {
    // fp32, fused: the two norms' inputs and outputs (4d), SwiGLU's gate and up, and its output
    // (3f). The ATen compositions keep a norm's fp32 copy of its input too (6d) and SwiGLU's
    // silu(gate) (4f).
    return 4 * (path.fused_layers ? 4 * d + attention + 3 * f : 6 * d + attention + 4 * f) +
           statistics;
  }
  // bf16 autocast: the residual stream and the norms' inputs stay fp32 (2 x 4d), and each product
  // keeps its own bf16 cast of its input: the fused q, k, v product of the attention norm's
  // output, the fused gate and up product of the feed-forward norm's (2 x 2d); gate, up and
  // SwiGLU's output in bf16 (3 x 2f). The ATen compositions keep the norms' fp32 copies too
  // (2 x 4d) and silu(gate) (2f).
  return (path.fused_layers ? 12 * d + 6 * f : 20 * d + 8 * f) + 2 * attention + statistics;
}

// Bytes per token outside the blocks. The chunked loss: the final norm's input (4d) and the
// gradient of its output, computed in forward in the output's dtype (fp32 4d; under autocast the
// fused norm gives bf16, 2d), and each row's loss. The CUDA cross-entropy: the norm's input and
// output as the chunked loss keeps them, the logits in the output projection's dtype (bf16 2V
// under autocast, else 4V) and each row's max and log-sum (8), and the norm's rstd (4). The ATen
// path: the norm's input, fp32 copy and output (12d; a bf16 cast of the output instead of the
// output itself under autocast, 10d) and the log-softmax of the logits (4V).
int64_t head_bytes_per_token(const ModelConfig& model, const ComputePath& path) {
  const int64_t d = model.d_model;
  const int64_t V = model.vocab_size;
  if (path.chunked_loss) return (path.bf16 && path.fused_layers ? 6 * d : 8 * d) + 4;
  if (path.cuda_loss) return (path.bf16 ? 6 * d + 2 * V : 8 * d + 4 * V) + 12;
  return (path.bf16 ? 10 * d : 12 * d) + 4 * V + 4;
}

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / kGB); }

// The largest micro-batch below config's that fits `target` and divides this rank's share of the
// global batch, so that gradient accumulation keeps the global batch as it is; none if no such
// one fits. Memory grows with the micro-batch, so the largest that fits is found by halving, and
// the divisors are found in pairs up to the square root: quick for any size a config can give.
std::optional<int64_t> smaller_micro_batch(const Config& config, const PlanTarget& target) {
  const auto fits = [&](int64_t micro_batch) {
    Config smaller = config;
    smaller.data.micro_batch = micro_batch;
    return plan_memory(smaller, target).fits();
  };
  if (config.data.micro_batch < 2 || !fits(1)) return std::nullopt;
  int64_t fitting = 1;  // fits; everything from `beyond` on does not
  int64_t beyond = config.data.micro_batch;
  while (beyond - fitting > 1) {
    const int64_t middle = fitting + (beyond - fitting) / 2;
    (fits(middle) ? fitting : beyond) = middle;
  }
  const int64_t per_rank = config.data.micro_batch * config.data.grad_accum;
  int64_t best = 1;
  for (int64_t divisor = 1; divisor <= per_rank / divisor; ++divisor) {
    if (per_rank % divisor != 0) continue;
    for (const int64_t candidate : {divisor, per_rank / divisor})
      if (candidate <= fitting) best = std::max(best, candidate);
  }
  return best;
}

}  // namespace

ComputePath compute_path(const Config& config, const PlanTarget& target) {
  const c10::Device device = target.cuda ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU);
  const Kernels kernels = choose_kernels(config.train.kernels, device);
  const bool ours = kernels == Kernels::fused_cpu;
  const bool fused_layers =
      (ours && fused_kernels_support(at::kFloat)) || kernels == Kernels::fused_cuda;
  // The rotary rows are fp32 for the fused layers, else in the dtype attention computes in, as is
  // the mask, which variable-length flash attention does without
  // (model/layers/document_attention.h).
  const int64_t compute_bytes = target.bf16 ? 2 : 4;
  const int64_t table_bytes = fused_layers ? 4 : compute_bytes;
  const bool variable_length = runs_variable_length_flash(
      device.type(), target.bf16 ? at::kBFloat16 : at::kFloat, config.model.head_dim);
  const int64_t mask_bytes = variable_length ? 0 : compute_bytes;
  const int64_t document_bytes =
      8 + 2 * table_bytes * config.model.head_dim + mask_bytes * config.data.seq_len;
  return {.bf16 = target.bf16,
          .fused_layers = fused_layers,
          .chunked_loss = ours,
          .cuda_loss = kernels == Kernels::fused_cuda,
          .repeated_kv =
              target.cuda && !target.bf16 && config.model.n_q_heads != config.model.n_kv_heads,
          .casts_weights = target.bf16 && !shards_weights(config, target.ranks),
          .document_bytes_per_token = config.data.document_masking ? document_bytes : 0};
}

double activation_bytes(const ModelConfig& model, int64_t tokens, const ComputePath& path,
                        bool activation_checkpointing) {
  // With checkpointing each block keeps only its input, the fp32 residual stream.
  const int64_t per_block =
      activation_checkpointing ? 4 * model.d_model : block_bytes_per_token(model, path);
  return static_cast<double>(tokens) *
         static_cast<double>(model.n_layers * per_block + head_bytes_per_token(model, path));
}

double working_bytes(const ModelConfig& model, int64_t tokens, const ComputePath& path,
                     bool activation_checkpointing) {
  const auto count = [](int64_t value) { return static_cast<double>(value); };
  // Autocast caches its bf16 casts of the weights for the forward pass.
  const double casts = path.casts_weights ? 2 * count(model.parameters()) : 0;
  // The chunked loss computes the output weight's gradient in forward, in fp32, and holds it into
  // backward; ATen's loss has backward hold the gradients of the log-softmax and of the logits,
  // about 8 bytes per token and word of the vocabulary; the CUDA cross-entropy writes the logits'
  // gradient over them.
  const double weight_gradient =
      path.chunked_loss ? 4 * count(model.vocab_size * model.d_model) : 0;
  const double logits =
      path.chunked_loss || path.cuda_loss ? 0 : 8 * count(tokens) * count(model.vocab_size);
  const double documents = count(tokens) * count(path.document_bytes_per_token);
  // Without checkpointing the products keep the casts for backward. With it the graph keeps none,
  // and they are gone when the autocast region ends, before backward; backward holds one block's
  // activations again while it recomputes it.
  if (!activation_checkpointing) return casts + weight_gradient + logits + documents;
  return weight_gradient + documents +
         std::max(casts, logits + count(tokens) * count(block_bytes_per_token(model, path)));
}

// optim.name muon (trainer/optim/muon_optimizer.h): one momentum per block matrix, and AdamW's two
// moments of the rest, which stay whole on every rank when sharded; the parameters are sharded
// whole (a fused projection with all its matrices), so an owner's share is at most an even share
// plus the largest parameter, the fused gate and up or q, k and v. The gradients are all-reduced
// whole, with no averaged part. The update of one parameter at a time takes temporaries of its
// size (its gradient's and momentum's, the stacked orthogonalised matrices) and the two Gram
// matrices of one matrix's shorter side.
void plan_muon(const Config& config, MemoryPlan& plan) {
  const ModelConfig& model = config.model;
  const auto values = static_cast<double>(plan.parameters);
  plan.muon = true;
  const auto count = [](int64_t value) { return static_cast<double>(value); };
  const double matrices =
      count(model.n_layers) * count(model.block_parameters() - 2 * model.d_model);
  const double largest = count(model.d_model) *
                         count(std::max({(model.n_q_heads + 2 * model.n_kv_heads) * model.head_dim,
                                         2 * model.d_ffn, model.n_q_heads * model.head_dim}));
  const double rest = values - matrices;
  plan.optimizer_unsharded = 8 * rest + 4 * matrices;
  plan.optimizer_sharded =
      8 * rest + 4 * std::min(matrices, std::ceil(matrices / plan.shard_ranks) + largest);
  plan.gradients =
      4 * values + (config.dist.grad_dtype == "bf16" && plan.target.ranks > 1 ? 2 * values : 0);
  const double side = count(model.d_model);  // a matrix's shorter side is at most d_model
  plan.working += 4 * (6 * largest + 2 * side * side);
}

namespace {

// The values of the model's largest parameter: the embedding, or a fused projection.
double largest_parameter(const ModelConfig& model) {
  return static_cast<double>(model.d_model) *
         static_cast<double>(
             std::max({model.vocab_size, (model.n_q_heads + 2 * model.n_kv_heads) * model.head_dim,
                       2 * model.d_ffn}));
}

// The gradient values held whole at once with the gradients sharded (dist.zero_stage 2): two
// buckets (one filling while the one before is reduce-scattered) of the largest a bucket takes,
// dist.bucket_mb or the largest parameter, which is a bucket of its own, and one parameter's
// gradient as autograd makes it, before it is copied into its bucket.
double released_buckets(const Config& config) {
  const ModelConfig& model = config.model;
  const auto count = [](int64_t value) { return static_cast<double>(value); };
  const double largest = largest_parameter(model);
  const double bucket = std::max(config.dist.bucket_mb * 1024 * 1024 / 4, largest);
  return std::min(2 * bucket + largest, count(model.parameters()));
}

// The values of ZeRO-3's largest unit: the embedding's (with the final norm when tied), the head's,
// or a block's.
double largest_unit(const ModelConfig& model) {
  const auto count = [](int64_t value) { return static_cast<double>(value); };
  const double embedding = count(model.vocab_size) * count(model.d_model) + count(model.d_model);
  return std::max(embedding, count(model.block_parameters()));
}

// The values of ZeRO-3's units whole at once (zero3_adamw.h): the unit running and the next one
// on its way, two consecutive units of embedding, blocks and head; with tied embeddings, the
// embedding's unit (which holds the final norm too) whole through the step, as the first unit and
// the last, and two blocks.
double whole_unit_values(const ModelConfig& model) {
  const auto count = [](int64_t value) { return static_cast<double>(value); };
  const double embedding = count(model.vocab_size) * count(model.d_model);
  const double block = count(model.block_parameters());
  if (model.tie_word_embeddings) return embedding + count(model.d_model) + 2 * block;
  const double head = embedding + count(model.d_model);
  return model.n_layers == 0 ? embedding + head : block + std::max({embedding, block, head});
}

}  // namespace

int shard_group_size(const Config& config, int ranks) {
  const int64_t shard_ranks = config.dist.shard_ranks;
  if (shard_ranks == 0 || config.dist.zero_stage == 0) return ranks;
  if (ranks % shard_ranks != 0) {
    throw UserError(fmt::format(
        "dist.shard_ranks {} does not divide the {} ranks: the ranks are cut into groups of that "
        "many, each holding a whole replica; use a divisor of {} (a node's ranks), or 0 for one "
        "group of all",
        shard_ranks, ranks, ranks));
  }
  return static_cast<int>(shard_ranks);
}

bool shards_optimizer(const Config& config, int ranks) {
  return config.dist.zero_stage >= 1 && shard_group_size(config, ranks) > 1;
}

bool shards_gradients(const Config& config, int ranks) {
  return config.dist.zero_stage >= 2 && shard_group_size(config, ranks) > 1;
}

bool shards_weights(const Config& config, int ranks) {
  return config.dist.zero_stage == 3 && shard_group_size(config, ranks) > 1;
}

MemoryPlan plan_memory(const Config& config, const PlanTarget& target) {
  const ModelConfig& model = config.model;
  const auto ranks = static_cast<double>(target.ranks);
  MemoryPlan plan;
  plan.parameters = model.parameters();
  plan.target = target;
  plan.shard_ranks = shard_group_size(config, target.ranks);
  // What is sharded is cut among the ranks of a group (all of them, but for dist.shard_ranks).
  const auto shard = static_cast<double>(plan.shard_ranks);
  plan.sharded = shards_optimizer(config, target.ranks);
  plan.activation_checkpointing = config.train.activation_checkpointing;

  const auto values = static_cast<double>(plan.parameters);
  // Sharded, each bucket pads to a multiple of the group's ranks: at most shard - 1 values a
  // bucket, left out here.
  const double part = std::ceil(values / shard);
  // What trains: every weight, or with LoRA the adapters alone, which have weights of their own
  // beside the frozen ones (and no sharding of the weights: config.cpp refuses stage 3).
  const double adapters = static_cast<double>(config.lora.parameters(model));
  plan.trained = config.lora.enabled() ? adapters : values;
  const double trained_part = std::ceil(plan.trained / shard);
  plan.runtime = target.cuda ? kCudaRuntimeBytes : kCpuRuntimeBytes;
  plan.weights_sharded = shards_weights(config, target.ranks);
  // Sharded, this rank's part of every unit and the units whole at once, gathered in bf16 under
  // bf16 autocast; and the rotary tables, cos and sin in fp32 for each of model.max_seq_len
  // positions.
  const double whole_units = std::min(whole_unit_values(model), values);
  const double gathered_bytes = target.bf16 ? 2 : 4;
  plan.weights =
      (plan.weights_sharded ? 4 * part + gathered_bytes * whole_units : 4 * (values + adapters)) +
      8 * static_cast<double>(model.max_seq_len) * static_cast<double>(model.head_dim);
  // The set-up and a rollback's load fill the weights a unit at a time (UnitShards::fill): the
  // largest unit whole in fp32 (gathered in another dtype, that tensor too, made for the
  // parameters to view), and on the CPU a parameter's values as the file gives them, in fp32 at
  // most (on CUDA they are read into the host's memory). The weights line counts the units whole at
  // once, which are not at that time. Evaluating gathers the units as training does, and saving
  // gathers nothing (each rank writes its parts, where the ranks share the run directory).
  if (plan.weights_sharded) {
    const double read = target.cuda ? 0 : 4 * largest_parameter(model);
    plan.unit_filled =
        std::max(0.0, (4 + (target.bf16 ? gathered_bytes : 0)) * largest_unit(model) + read -
                          gathered_bytes * whole_units);
  }
  plan.gradients_sharded = shards_gradients(config, target.ranks);
  // Whole gradients: every bucket, or with the gradients sharded those in use (released_buckets;
  // with the weights sharded, the buckets are the units whole at once, and one parameter's
  // gradient as autograd makes it, in the dtype the unit is gathered in: counted here in fp32's
  // values).
  const double autograd_gradient = gathered_bytes / 4 * largest_parameter(model);
  const double whole = !plan.gradients_sharded ? plan.trained
                       : plan.weights_sharded  ? std::min(whole_units + autograd_gradient, values)
                                               : std::min(released_buckets(config), plan.trained);
  plan.gradients = 4 * whole + (plan.sharded ? 4 * trained_part : 0);
  const bool bf16_wire = config.dist.grad_dtype == "bf16" && ranks > 1;
  // dist.grad_dtype bf16: each bucket's bf16 copy on the wire.
  if (bf16_wire) plan.gradients += 2 * whole;
  if (plan.gradients_sharded) {
    // Released buckets receive each micro-step's part in one buffer of the largest bucket's part,
    // or two taken in turn with overlap (grad_reducer.h), to add it up.
    const bool overlap =
        config.dist.overlap == "true" || (config.dist.overlap == "auto" && target.cuda);
    const double largest_bucket =
        plan.weights_sharded
            ? largest_unit(model)
            : std::max(config.dist.bucket_mb * 1024 * 1024 / 4, largest_parameter(model));
    plan.gradients += (bf16_wire ? 2 : 4) * (overlap ? 2 : 1) * std::ceil(largest_bucket / shard);
  } else if (bf16_wire && plan.sharded) {
    plan.gradients += 2 * trained_part;  // each bucket's part received in bf16
  }
  plan.optimizer_unsharded = 8 * plan.trained;
  plan.optimizer_sharded = 8 * trained_part;

  const int64_t tokens = config.data.micro_batch * config.data.seq_len;
  const ComputePath path = compute_path(config, target);
  plan.activations_kept_all = activation_bytes(model, tokens, path, false);
  plan.activations_checkpointed = activation_bytes(model, tokens, path, true);
  plan.activations =
      plan.activation_checkpointing ? plan.activations_checkpointed : plan.activations_kept_all;

  plan.working = working_bytes(model, tokens, path, plan.activation_checkpointing);
  if (config.optim.name == "muon") plan_muon(config, plan);
  plan.optimizer = plan.sharded ? plan.optimizer_sharded : plan.optimizer_unsharded;
  // What resuming reads: the weights a tensor at a time, then the state whole or, where AdamW's is
  // sharded, this rank's part of it; or with train.async_checkpoint, when larger, rank 0's copy of
  // what it writes, held from the first checkpoint on: the weights and the state, or its parts of
  // them where they are sharded (Muon's state is gathered whole).
  plan.state_read_in_parts = plan.sharded && !plan.muon;
  plan.checkpoint_host =
      std::max(4 * largest_parameter(model),
               plan.state_read_in_parts ? plan.optimizer : plan.optimizer_unsharded);
  if (config.train.async_checkpoint) {
    plan.async_checkpoint = true;
    const double weights_copy = plan.weights_sharded ? 4 * part : 4 * values;
    const double state_copy = plan.muon ? plan.optimizer_unsharded : plan.optimizer;
    plan.checkpoint_host = std::max(plan.checkpoint_host, weights_copy + state_copy);
  }
  return plan;
}

std::string describe(const MemoryPlan& plan) {
  std::string text = fmt::format(
      "memory plan per rank ({} parameters, {} rank{} on {}, {}):\n", plan.parameters,
      plan.target.ranks, plan.target.ranks == 1 ? "" : "s", plan.target.cuda ? "CUDA" : "the CPU",
      plan.target.bf16 ? "bf16 autocast" : "fp32");
  const auto line = [&](const char* part, double bytes, const std::string& note) {
    std::string row = fmt::format("  {:<34} {:>10}   {}", part, gb(bytes), note);
    row.erase(row.find_last_not_of(' ') + 1);
    text += row + "\n";
  };
  line("runtime (libraries, buffers)", plan.runtime, "an estimate");
  const bool lora = plan.trained < static_cast<double>(plan.parameters);
  line("weights (fp32)", plan.weights,
       lora                    ? fmt::format("frozen, and LoRA's {:.0f} adapter parameters, which "
                                                                "alone have gradients and state",
                                             plan.trained)
       : !plan.weights_sharded ? ""
       : plan.target.bf16      ? "this rank's part, and the units whole at once in bf16"
                               : "this rank's part, and the units whole at once");
  line("gradients (fp32 buckets)", plan.gradients,
       plan.gradients_sharded ? "this rank's averaged part, and the buckets in use"
       : plan.sharded         ? "and this rank's averaged part"
                              : "");
  line(plan.muon ? "optimizer state (Muon and AdamW)" : "optimizer state (AdamW moments)",
       plan.optimizer,
       fmt::format("dist.zero_stage 0: {}, 1: {} cut among {} ranks", gb(plan.optimizer_unsharded),
                   gb(plan.optimizer_sharded), plan.shard_ranks));
  line("activations per micro-batch", plan.activations,
       fmt::format("train.activation_checkpointing false: {}, true: {}",
                   gb(plan.activations_kept_all), gb(plan.activations_checkpointed)));
  line("working (casts, logits, recompute)", plan.working, "");
  if (plan.weights_sharded) {
    line("a unit filled between steps", plan.unit_filled,
         "the set-up and a rollback make one unit whole at a time, in place of the activations");
  }
  if (plan.target.device_memory) {
    line("total", plan.total(),
         fmt::format("of {} per rank: {}", gb(*plan.target.device_memory),
                     plan.fits() ? "fits" : "does NOT fit"));
  } else {
    line("total", plan.total(), "(the device's memory is not known)");
  }
  line("checkpoint save/resume (host)", plan.checkpoint_host,
       plan.async_checkpoint ? "not in the total: the larger of rank 0's copy of what it writes in "
                               "the background and what resuming reads"
       : plan.state_read_in_parts
           ? "not in the total: resuming reads the weights a tensor at a time and this rank's part "
             "of the state"
           : "not in the total: every rank reads the whole state to resume");
  text.pop_back();  // the caller ends the last line
  return text;
}

std::string memory_shortfall(const MemoryPlan& plan, const Config& config) {
  if (plan.fits()) return "";
  // Each remedy alone, then both, then the largest micro-batch that divides this rank's share of
  // the global batch, so that gradient accumulation keeps the global batch as it is.
  std::vector<std::string> remedies;
  const auto fits_with = [&](const Config& changed) {
    return plan_memory(changed, plan.target).fits();
  };
  Config sharded = config;
  sharded.dist.zero_stage = 1;
  Config checkpointed = config;
  checkpointed.train.activation_checkpointing = true;
  Config both = sharded;
  both.train.activation_checkpointing = true;
  Config gradients_sharded = config;
  gradients_sharded.dist.zero_stage = 2;
  Config weights_sharded = config;
  weights_sharded.dist.zero_stage = 3;
  if (!plan.sharded && plan.target.ranks > 1 && fits_with(sharded)) {
    remedies.push_back("dist.zero_stage=1");
  } else if (!plan.gradients_sharded && plan.target.ranks > 1 && config.optim.name != "muon" &&
             fits_with(gradients_sharded)) {
    remedies.push_back("dist.zero_stage=2");
  } else if (!plan.weights_sharded && plan.target.ranks > 1 && config.optim.name != "muon" &&
             fits_with(weights_sharded)) {
    remedies.push_back("dist.zero_stage=3");
  }
  if (!plan.activation_checkpointing && fits_with(checkpointed))
    remedies.push_back("train.activation_checkpointing=true");
  if (remedies.empty() && plan.target.ranks > 1 && fits_with(both))
    remedies.push_back("dist.zero_stage=1 with train.activation_checkpointing=true");
  // As configured, else with both of the remedies above.
  for (const bool with_both : {false, true}) {
    if (const auto micro_batch = smaller_micro_batch(with_both ? both : config, plan.target)) {
      remedies.push_back(fmt::format(
          "{}data.micro_batch={} with data.grad_accum={}",
          with_both ? "dist.zero_stage=1, train.activation_checkpointing=true and " : "",
          *micro_batch, config.data.micro_batch * config.data.grad_accum / *micro_batch));
      break;
    }
  }
  return fmt::format(
      "the memory plan needs {} per rank but a rank has {}: {} (see --dry-run for the plan)",
      gb(plan.total()), gb(*plan.target.device_memory),
      remedies.empty() ? fmt::format("nothing in the config makes it fit: more ranks with "
                                     "dist.zero_stage={}, or a smaller model",
                                     config.optim.name == "muon" ? 1 : 3)
                       : "it would fit with " + fmt::format("{}", fmt::join(remedies, ", or ")));
}

std::string describe_stages(const Config& config, const PlanTarget& target) {
  if (target.ranks < 2 || !target.device_memory) return "";
  std::string text = fmt::format(
      "dist.zero_stage per rank of {} ranks of {}{}:", target.ranks, gb(*target.device_memory),
      config.dist.shard_ranks > 0
          ? fmt::format(", sharded within groups of dist.shard_ranks = {}", config.dist.shard_ranks)
          : "");
  std::optional<int64_t> lowest;
  for (int64_t stage = 0; stage <= 3; ++stage) {
    if (stage >= 2 && config.optim.name == "muon") {
      text += fmt::format(" {}: not with Muon;", stage);
      continue;
    }
    if (stage == 0 && config.dist.shard_ranks > 0) {
      text += " 0: not with dist.shard_ranks;";
      continue;
    }
    Config staged = config;
    staged.dist.zero_stage = stage;
    const MemoryPlan plan = plan_memory(staged, target);
    text += fmt::format(" {}: {} ({});", stage, gb(plan.total()),
                        plan.fits() ? "fits" : "does not fit");
    if (plan.fits() && !lowest) lowest = stage;
  }
  text.pop_back();
  return text + (lowest ? fmt::format(". The lowest that fits: dist.zero_stage={}", *lowest)
                        : std::string(". None fits"));
}

}  // namespace mltrain
