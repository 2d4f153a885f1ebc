// The memory plan against closed-form counts for the base model, and its activation estimate
// against the bytes the CPU allocator hands out for one micro-batch's graph (on CUDA:
// tests/gpu/memory_plan_cuda_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "common/error.h"
#include "dist/communicator.h"
#include "model/interop/hf_state_dict.h"
#include "model/kernels/cpu_kernels.h"
#include "model/kernels/kernels.h"
#include "model/layers/llama.h"
#include "tests/support/activation_memory.h"
#include "tests/support/test_support.h"
#include "trainer/config/config.h"
#include "trainer/optim/optimizer.h"
#include "trainer/run/memory_plan.h"

namespace mltrain {
namespace {

using testing::measured_activations;
using testing::small_base;

DataParallelOptions muon_options() {
  DataParallelOptions options;
  options.muon = MuonOptions{};
  return options;
}

constexpr int64_t kBaseParameters = 35'926'528;  // the 0.04B MiniLLaMA, as Hugging Face counts it

TEST(ModelConfig, CountsTheParametersOfTheModelItDescribes) {
  EXPECT_EQ(ModelConfig().parameters(), kBaseParameters);
  ModelConfig untied = small_base();
  untied.tie_word_embeddings = false;
  for (const ModelConfig& config : {small_base(), untied})
    EXPECT_EQ(config.parameters(), Llama(config, Kernels::aten)->num_parameters());
}

TEST(MemoryPlan, CountsTheBaseModelsWeightsGradientsAndOptimizerState) {
  Config config;  // the base model
  const int64_t p = kBaseParameters;
  const int64_t eighth = (p + 7) / 8;
  const MemoryPlan plain =
      plan_memory(config, {.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt});
  EXPECT_EQ(plain.weights, 4 * p + 2 * 4 * 1024 * 64);  // and the rotary tables' cos and sin
  EXPECT_EQ(plain.gradients, 4 * p);
  EXPECT_EQ(plain.optimizer, 8 * p);
  EXPECT_EQ(plain.optimizer_sharded, 8 * eighth);
  EXPECT_EQ(plain.checkpoint_host, 8 * p);  // the whole state, read to resume

  config.dist.zero_stage = 1;
  const MemoryPlan sharded =
      plan_memory(config, {.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt});
  EXPECT_EQ(sharded.optimizer, 8 * eighth);
  EXPECT_EQ(sharded.gradients, 4 * p + 4 * eighth);  // the buckets, and this rank's averaged part
  EXPECT_EQ(sharded.total() - plain.total(), 8 * eighth + 4 * eighth - 8 * p);
  // Resuming reads the weights a tensor at a time (the largest, the embedding, 4096 x 512) and
  // this rank's eighth of the state, which is more.
  EXPECT_EQ(sharded.checkpoint_host, std::max<int64_t>(4 * 4096 * 512, 8 * eighth));
  EXPECT_EQ(sharded.checkpoint_host, 8 * eighth);
  EXPECT_CONTAINS(describe(sharded), "this rank's part of the state");

  // Asynchronous checkpoints keep rank 0's copy of what it writes on the host: the fp32 weights
  // and both moments; at stage 1 the weights and its eighth of the moments, more than resuming
  // reads; at stage 3 its eighths of both.
  config.train.async_checkpoint = true;
  const auto async_host = [&](int stage) {
    config.dist.zero_stage = stage;
    return plan_memory(config,
                       {.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt})
        .checkpoint_host;
  };
  EXPECT_EQ(async_host(0), 12 * p);
  EXPECT_EQ(async_host(1), 4 * p + 8 * eighth);
  EXPECT_EQ(async_host(3), 12 * eighth);
  config.dist.zero_stage = 1;
  const MemoryPlan async =
      plan_memory(config, {.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt});
  EXPECT_EQ(async.total(), sharded.total());
  EXPECT_CONTAINS(describe(async), "writes in the background");
}

// With LoRA the adapters alone have gradients and optimizer state: for the 1.1B model with
// adapters of rank 8 on all seven projections, the state is under 2% of full fine-tuning's (issue
// 45's target), and the frozen weights are still held whole, beside the adapters'.
TEST(MemoryPlan, LoraHoldsStateAndGradientsOfTheAdaptersAlone) {
  Config config =
      load_config(std::filesystem::path(MLTRAIN_SOURCE_DIR) / "configs" / "llama-1b.yaml");
  config.dist.zero_stage = 0;  // every rank holds the whole state: the closed forms below
  const PlanTarget eight{.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt};
  const MemoryPlan full = plan_memory(config, eight);
  config.lora.rank = 8;
  const MemoryPlan lora = plan_memory(config, eight);
  const ModelConfig& m = config.model;
  const int64_t q = m.n_q_heads * m.head_dim;
  const int64_t kv = m.n_kv_heads * m.head_dim;
  const int64_t adapters =
      m.n_layers * 8 *
      ((m.d_model + q) + 2 * (m.d_model + kv) + (q + m.d_model) + 3 * (m.d_model + m.d_ffn));
  EXPECT_EQ(lora.trained, adapters);
  EXPECT_EQ(lora.optimizer, 8 * adapters);
  EXPECT_EQ(lora.gradients, 4 * adapters);
  EXPECT_EQ(lora.weights, full.weights + 4 * adapters);
  EXPECT_LE(lora.optimizer / full.optimizer, 0.02);
  EXPECT_CONTAINS(describe(lora), "LoRA's");
}

// Hybrid sharding (dist.shard_ranks 2 of 8 ranks): what is sharded is cut in halves, not
// eighths; and the groups must divide the ranks.
TEST(MemoryPlan, HybridShardingCutsTheStateAmongAGroupOnly) {
  Config config;  // the base model
  const int64_t p = kBaseParameters;
  const int64_t half = (p + 1) / 2;
  config.dist.zero_stage = 1;
  config.dist.shard_ranks = 2;
  const PlanTarget eight{.ranks = 8, .cuda = true, .bf16 = false, .device_memory = std::nullopt};
  const MemoryPlan hybrid = plan_memory(config, eight);
  EXPECT_EQ(hybrid.shard_ranks, 2);
  EXPECT_EQ(hybrid.optimizer, 8 * half);
  EXPECT_EQ(hybrid.gradients, 4 * p + 4 * half);
  // At stage 3 a rank holds half the weights, as 2 ranks without groups would.
  config.dist.zero_stage = 3;
  const MemoryPlan hybrid3 = plan_memory(config, eight);
  config.dist.shard_ranks = 0;
  const MemoryPlan two =
      plan_memory(config, {.ranks = 2, .cuda = true, .bf16 = false, .device_memory = std::nullopt});
  EXPECT_EQ(hybrid3.weights, two.weights);
  EXPECT_EQ(hybrid3.gradients, two.gradients);
  EXPECT_EQ(hybrid3.optimizer, two.optimizer);
  EXPECT_LT(plan_memory(config, eight).weights, hybrid3.weights);

  config.dist.shard_ranks = 3;
  EXPECT_THROW(plan_memory(config, eight), UserError);
}

// Under bf16 autocast, ZeRO-3 gathers its units in bf16 (dist/unit_shards.h): the units whole at
// once and the gradient autograd makes of one parameter take half their fp32 bytes, and autocast
// casts no weight, where without sharding it keeps a bf16 cast of every one (2 bytes a
// parameter).
TEST(MemoryPlan, ShardedWeightsUnderBf16AreGatheredInBf16AndNeverCast) {
  Config config;  // the base model: tied embeddings, its largest parameter the embedding
  config.train.activation_checkpointing = false;
  const ModelConfig& model = config.model;
  const int64_t p = kBaseParameters;
  const int64_t embedding = model.vocab_size * model.d_model;
  const int64_t whole_at_once = embedding + model.d_model + 2 * model.block_parameters();
  const auto plan = [&](int stage, bool bf16) {
    config.dist.zero_stage = stage;
    return plan_memory(config,
                       {.ranks = 8, .cuda = true, .bf16 = bf16, .device_memory = std::nullopt});
  };
  const MemoryPlan fp32 = plan(3, false);
  const MemoryPlan bf16 = plan(3, true);
  EXPECT_EQ(fp32.weights - bf16.weights, 2 * whole_at_once);
  EXPECT_EQ(fp32.gradients - bf16.gradients, 2 * embedding);
  EXPECT_EQ(plan(0, true).working - bf16.working, 2 * p);
  EXPECT_CONTAINS(describe(bf16), "the units whole at once in bf16");

  // The set-up fills the weights a unit at a time: the largest unit whole in fp32 (and in bf16),
  // beyond the units whole at once in training that the weights count. For the base model the
  // largest unit is a block: in fp32 nothing beyond them, in bf16 a little. With a vocabulary of
  // 65,536 the embedding's unit (with the final norm) is the largest, and the CPU also reads a
  // parameter in fp32.
  EXPECT_EQ(fp32.unit_filled, 0);
  EXPECT_EQ(bf16.unit_filled, 6 * model.block_parameters() - 2 * whole_at_once);
  config.model.vocab_size = 65536;
  const int64_t big_unit = 65536 * model.d_model + model.d_model;
  const int64_t big_whole_at_once = big_unit + 2 * model.block_parameters();
  EXPECT_EQ(plan(3, true).unit_filled, 6 * big_unit - 2 * big_whole_at_once);
  const MemoryPlan on_cpu = plan_memory(
      config, {.ranks = 8, .cuda = false, .bf16 = false, .device_memory = std::nullopt});
  EXPECT_EQ(on_cpu.unit_filled, 4 * big_unit + 4 * 65536 * model.d_model - 4 * big_whole_at_once);
}

// Muon keeps one momentum per block matrix (AdamW two moments of the rest), shards whole
// parameters, and all-reduces the gradients whole; the unsharded plan is the bytes MuonOptimizer
// holds, less the AdamW step count.
TEST(MemoryPlan, CountsMuonsMomentumAndItsShardingByMatrix) {
  Config config;  // the base model
  config.optim.name = "muon";
  const int64_t p = kBaseParameters;
  // 12 blocks of wqkv (768 x 512: q 512 rows, k and v 128 each), wo (512 x 512), w_gate_up
  // (2816 x 512) and w_down (512 x 1408).
  const int64_t matrices = 12 * (768 * 512 + 512 * 512 + 2816 * 512 + 512 * 1408);
  // An owner's share is at most an even share plus the largest parameter, w_gate_up: the plan
  // must hold a rank dealt an even share and then w_gate_up.
  const int64_t largest = 2816 * 512;
  const MemoryPlan plain =
      plan_memory(config, {.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt});
  EXPECT_EQ(plain.optimizer, 8 * (p - matrices) + 4 * matrices);
  config.dist.zero_stage = 1;
  const MemoryPlan sharded =
      plan_memory(config, {.ranks = 8, .cuda = true, .bf16 = true, .device_memory = std::nullopt});
  EXPECT_GE(sharded.optimizer, 8 * (p - matrices) + 4 * (matrices / 8 + largest));
  EXPECT_LE(sharded.optimizer, 8 * (p - matrices) + 4 * (matrices / 8 + 1 + largest));
  EXPECT_EQ(sharded.gradients, 4 * p) << "all-reduced whole: no averaged part";
  EXPECT_CONTAINS(describe(sharded), "optimizer state (Muon and AdamW)");

  Config small;
  small.model = small_base();
  small.optim.name = "muon";
  const MemoryPlan small_plan =
      plan_memory(small, {.ranks = 1, .cuda = false, .bf16 = false, .device_memory = std::nullopt});
  Llama model(small.model, Kernels::aten);
  const auto communicator = make_communicator(World());
  const std::unique_ptr<Optimizer> optimizer =
      make_optimizer(hf_parameters(model), *communicator, muon_options());
  EXPECT_EQ(static_cast<double>(optimizer->state_bytes()), small_plan.optimizer + 4);
}

// On both of the CPU's paths, mltrain's kernels with the chunked loss and the ATen compositions
// with the whole logits (what CUDA runs), in fp32 and bf16, with and without checkpointing.
TEST(MemoryPlan, ActivationsMatchWhatTheGraphOfAMicroBatchHolds) {
  const ModelConfig model = small_base();
  const int64_t batch = 4;
  const int64_t length = 64;
  for (const Kernels kernels : {Kernels::fused_cpu, Kernels::aten}) {
    for (const bool bf16 : {false, true}) {
      const bool ours = kernels == Kernels::fused_cpu;
      const ComputePath path{.bf16 = bf16,
                             .fused_layers = ours && fused_kernels_support(at::kFloat),
                             .chunked_loss = ours};
      for (const bool checkpointing : {false, true}) {
        const int64_t measured =
            measured_activations(model, kernels, batch, length, bf16, checkpointing);
        // Held after forward, besides the activations: the weights' casts, and the chunked loss's
        // weight gradient (the gradients of the ATen path's logits come in backward).
        const double planned = activation_bytes(model, batch * length, path, checkpointing) +
                               (bf16 ? 2 * model.parameters() : 0) +
                               (ours ? 4 * model.vocab_size * model.d_model : 0);
        EXPECT_NEAR(static_cast<double>(measured), planned, 0.03 * measured)
            << (ours ? "fused" : "aten") << (bf16 ? ", bf16" : ", fp32")
            << (checkpointing ? ", checkpointing" : "");
      }
    }
  }
}

// What document masking adds: each token's position and rotary rows, and its row of the mask.
TEST(MemoryPlan, PackedDocumentsAddWhatTheirTablesAndMaskHold) {
  const ModelConfig model = small_base();
  const int64_t batch = 4;
  const int64_t length = 64;
  Config config;
  config.model = model;
  config.data.seq_len = length;
  config.data.document_masking = true;
  for (const Kernels kernels : {Kernels::fused_cpu, Kernels::aten}) {
    for (const bool bf16 : {false, true}) {
      config.train.kernels = kernels == Kernels::aten ? "aten" : "fused";
      PlanTarget cpu;
      cpu.bf16 = bf16;
      const ComputePath path = compute_path(config, cpu);
      const int64_t plain = measured_activations(model, kernels, batch, length, bf16, false);
      const int64_t masked = measured_activations(model, kernels, batch, length, bf16, false,
                                                  /*document_start=*/5);
      const int64_t planned = batch * length * path.document_bytes_per_token;
      // The plain forward under autocast on the ATen layers casts the rotary tables [T, head_dim]
      // to bf16 in each layer, and keeps the casts of cos and sin for backward; the packed forward
      // casts its tables once.
      const int64_t plain_table_casts =
          !path.fused_layers && bf16 ? model.n_layers * 2 * length * model.head_dim * 2 : 0;
      // Exact up to the documents' bounds (a few int32).
      EXPECT_NEAR(masked - plain, planned - plain_table_casts, 64)
          << config.train.kernels << (bf16 ? ", bf16" : ", fp32");
    }
  }
}

// mltrain's CUDA cross-entropy (fused_cuda) keeps the logits once, in the output projection's
// dtype, with each row's max and log-sum, and writes their gradient over them: none of ATen's
// log-softmax and gradients of the logits. Per token outside the blocks, beside the logits: the
// final norm's fp32 input, its output (bf16 under autocast) and rstd.
TEST(MemoryPlan, TheCudaCrossEntropyKeepsTheLogitsOnceInTheirDtype) {
  Config config;  // the base model: d 512, V 4096, 12 layers
  config.train.kernels = "fused_cuda";
  const int64_t tokens = 16 * 1024;
  for (const bool bf16 : {false, true}) {
    const ComputePath path =
        compute_path(config, {.ranks = 1, .cuda = true, .bf16 = bf16, .device_memory = 80e9});
    EXPECT_TRUE(path.cuda_loss);
    // With checkpointing the blocks keep their fp32 inputs alone: the rest is the head.
    const double head = activation_bytes(config.model, tokens, path, true) / tokens - 12 * 4 * 512;
    const double logits = (bf16 ? 2 : 4) * 4096;
    EXPECT_DOUBLE_EQ(head, (bf16 ? 4 + 2 : 4 + 4) * 512 + 4 + logits + 8);
    // Besides autocast's casts of the weights, no buffer of [tokens, V].
    EXPECT_DOUBLE_EQ(working_bytes(config.model, tokens, path, false),
                     bf16 ? 2.0 * kBaseParameters : 0.0);
  }
  config.train.kernels = "aten";
  EXPECT_FALSE(compute_path(config, {.ranks = 1, .cuda = true, .bf16 = true, .device_memory = 80e9})
                   .cuda_loss);
}

TEST(MemoryPlan, CheckpointingCutsTheBaseModelsActivationsManyTimes) {
  const int64_t tokens = 16 * 1024;
  for (const bool bf16 : {false, true}) {
    const ComputePath path{.bf16 = bf16};
    const double kept = activation_bytes(ModelConfig(), tokens, path, false);
    EXPECT_GT(kept / activation_bytes(ModelConfig(), tokens, path, true), 3.0);
  }
}

TEST(MemoryPlan, APlanThatDoesNotFitNamesWhatWouldMakeItFit) {
  Config config;
  config.train.device = "cuda";
  const PlanTarget roomy{.ranks = 8, .cuda = true, .bf16 = true, .device_memory = 80'000'000'000};
  EXPECT_EQ(memory_shortfall(plan_memory(config, roomy), config), "");
  // Activations dominate at 16 x 1024 tokens: checkpointing, or fewer sequences, fit 4 GB.
  PlanTarget small = roomy;
  small.device_memory = 4'000'000'000;
  const MemoryPlan plan = plan_memory(config, small);
  ASSERT_FALSE(plan.fits());
  const std::string message = memory_shortfall(plan, config);
  EXPECT_CONTAINS(message, "per rank but a rank has 4.00 GB");
  EXPECT_CONTAINS(message, "train.activation_checkpointing=true");
  // A micro-batch that divides the 64 sequences a rank takes per step, with the accumulation
  // that keeps them.
  EXPECT_CONTAINS(message, "data.micro_batch=4 with data.grad_accum=16");
  Config fixed = config;
  fixed.train.activation_checkpointing = true;
  EXPECT_TRUE(plan_memory(fixed, small).fits());
  // Where no one remedy is enough, both with a smaller micro-batch.
  PlanTarget tiny = roomy;
  tiny.device_memory = 1'900'000'000;
  const std::string tight = memory_shortfall(plan_memory(config, tiny), config);
  EXPECT_CONTAINS(tight,
                  "it would fit with dist.zero_stage=1, train.activation_checkpointing=true "
                  "and data.micro_batch=");
}

// The largest batch a config may ask for, 2^40 tokens of a micro-batch, is planned in bytes that
// do not overflow, and the remedy is found among its 2^30 micro-batch sizes by halving.
TEST(MemoryPlan, TheLargestBatchAConfigTakesIsPlannedWithoutOverflow) {
  Config config;
  config.data.micro_batch = int64_t{1} << 30;
  config.data.grad_accum = 1;
  const PlanTarget gpu{.ranks = 8, .cuda = true, .bf16 = true, .device_memory = 80e9};
  const MemoryPlan plan = plan_memory(config, gpu);
  // Per token, the ATen path keeps at least the logits' log-softmax: 4 bytes a word of the
  // vocabulary.
  EXPECT_GT(plan.activations, 4.0 * 4096 * 0x1p40);
  EXPECT_FALSE(plan.fits());
  EXPECT_CONTAINS(memory_shortfall(plan, config), "data.micro_batch=");
  // Shown as counted, past what 64-bit integers hold (the logits alone are 2^63 bytes here).
  config.model.vocab_size = 1 << 20;
  const std::string shown = describe(plan_memory(config, gpu));
  EXPECT_EQ(shown.find(" -"), std::string::npos) << shown;
}

}  // namespace
}  // namespace mltrain
