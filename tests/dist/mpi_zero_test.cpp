// The scattering reducer, ZeRO-1 and ZeRO-3 across ranks: run by ctest under `mpirun -n 2` and
// `mpirun -n 3` on the CPU (MPI backend).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "dist/bucket_layout.h"
#include "dist/grad_reducer.h"
#include "dist/world.h"
#include "model/interop/hf_state_dict.h"
#include "model/interop/safetensors.h"
#include "model/kernels/autocast_region.h"
#include "model/layers/llama.h"
#include "tests/dist/mpi_test_world.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "trainer/checkpoint/checkpoint_store.h"
#include "trainer/machine/cpu_allocation_counter.h"
#include "trainer/optim/clipping.h"
#include "trainer/optim/zero1_adamw.h"
#include "trainer/optim/zero3_adamw.h"
#include "trainer/run/memory_plan.h"

namespace mltrain {
namespace {

const World& world = testing::mpi_world;

// Rank `rank`'s windows: its own draw, that any rank can make again.
at::Tensor windows_of(int rank) {
  at::manual_seed(100 + rank);
  return at::randint(testing::tiny_config().vocab_size, {2, 17});
}

void backward_on(Llama& model, const at::Tensor& windows) {
  next_token_loss(model(windows.narrow(1, 0, 16)), windows.narrow(1, 1, 16)).backward();
}

// One step of `optimizer` on this rank's windows.
void step_once(Llama& model, Optimizer& optimizer) {
  backward_on(model, windows_of(world.rank));
  optimizer.reduce_gradients();
  optimizer.update(1e-2, at::zeros({}));
}

Llama fresh_model() {
  at::manual_seed(7);
  return Llama(testing::tiny_config(), Kernels::fused_cpu);
}

const BucketSizes small_buckets{.bucket_mb = 0.02, .first_bucket_mb = 0.01};

// The whole of `bucket`'s averaged gradient, laid out as the bucket lays out its parameters:
// the gradients of `reference`, which summed every rank's, over the ranks.
at::Tensor averaged_bucket(const BucketLayout& bucket, const std::vector<at::Tensor>& reference) {
  at::Tensor averaged = at::zeros({bucket.elements});
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const at::Tensor grad = reference[bucket.members[k]].grad().flatten();
    averaged.narrow(0, bucket.offsets[k], grad.numel()).copy_(grad / world.size);
  }
  return averaged;
}

// The averaged gradients of each bucket's part, reduce-scattered in fp32, or in bf16 on the wire
// (to bf16's precision); the parameters untouched.
TEST(ScatteringReducer, EachRankReceivesTheAverageOfItsPartOfEveryBucket) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  // The reference: every rank's gradient, computed here, averaged.
  Llama reference = fresh_model();
  for (int rank = 0; rank < world.size; ++rank) backward_on(reference, windows_of(rank));
  const std::vector<at::Tensor> reference_parameters = reference->parameters();

  for (const bool compress_bf16 : {false, true}) {
    Llama model = fresh_model();
    const std::vector<at::Tensor> parameters = model->parameters();
    std::vector<const void*> places;
    for (const at::Tensor& parameter : parameters) places.push_back(parameter.data_ptr());
    const auto communicator = make_communicator(world);
    const std::vector<BucketLayout> buckets = assign_buckets(parameters, small_buckets, world.size);
    GradReducer reducer(parameters, buckets, *communicator,
                        {.compress_bf16 = compress_bf16, .scatter = true});
    ASSERT_GT(buckets.size(), 2u) << "the test should cover several buckets";
    backward_on(model, windows_of(world.rank));
    reducer.finish();

    ASSERT_EQ(reducer.averaged_parts().size(), buckets.size());
    for (size_t b = 0; b < buckets.size(); ++b) {
      const BucketLayout& bucket = buckets[b];
      const at::Tensor expected = averaged_bucket(bucket, reference_parameters);
      EXPECT_EQ(bucket.elements % world.size, 0);
      const int64_t part = bucket.part_elements(world.size);
      EXPECT_LE(testing::relative_error(reducer.averaged_parts()[b],
                                        expected.narrow(0, part * world.rank, part)),
                compress_bf16 ? 1e-2 : 1e-6)
          << (compress_bf16 ? "bf16 on the wire" : "fp32");
    }
    // The reducer never owns the parameters: they stay where they were, with their values.
    const Llama untouched = fresh_model();
    const std::vector<at::Tensor> original = untouched->parameters();
    for (size_t i = 0; i < original.size(); ++i) {
      EXPECT_EQ(parameters[i].data_ptr(), places[i]) << "parameter " << i;
      EXPECT_TRUE(at::equal(parameters[i], original[i])) << "parameter " << i;
    }
  }
}

// Rank `rank`'s windows of micro-step `micro`.
at::Tensor micro_windows(int rank, int micro) {
  at::manual_seed(200 + 2 * rank + micro);
  return at::randint(testing::tiny_config().vocab_size, {2, 17});
}

// Released buckets (ZeRO-2): every micro-step is reduce-scattered as backward completes each
// bucket, and each rank's parts add up the micro-steps' averages: the average over the ranks of
// their gradients summed over the micro-steps, as a scattered reducer receives it after
// accumulating. Between backwards no whole gradient is left: every .grad let go, and nothing
// allocated since the reducer was made but its parts (and the buffers they are received in),
// with and without overlap.
TEST(ReleasedReducer, EachRankAddsUpItsPartOfEveryMicroStepAndKeepsNoWholeGradient) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  constexpr int kMicroSteps = 2;
  Llama reference = fresh_model();
  for (int rank = 0; rank < world.size; ++rank) {
    for (int micro = 0; micro < kMicroSteps; ++micro)
      backward_on(reference, micro_windows(rank, micro));
  }
  const std::vector<at::Tensor> reference_parameters = reference->parameters();

  for (const bool compress_bf16 : {false, true}) {
    for (const bool overlap : {false, true}) {
      SCOPED_TRACE(fmt::format("bf16 {}, overlap {}", compress_bf16, overlap));
      Llama model = fresh_model();
      const std::vector<at::Tensor> parameters = model->parameters();
      const auto communicator = make_communicator(world);
      const std::vector<BucketLayout> buckets =
          assign_buckets(parameters, small_buckets, world.size);
      const CpuAllocationCounter counter;
      GradReducer reducer(parameters, buckets, *communicator,
                          {.overlap = overlap,
                           .compress_bf16 = compress_bf16,
                           .scatter = true,
                           .release_buckets = true});
      for (int micro = 0; micro < kMicroSteps; ++micro) {
        reducer.set_sync(micro + 1 == kMicroSteps);
        backward_on(model, micro_windows(world.rank, micro));
        for (size_t i = 0; i < parameters.size(); ++i)
          EXPECT_FALSE(parameters[i].grad().defined()) << "parameter " << i << " kept its .grad";
      }
      reducer.finish();

      int64_t part_bytes = 0;    // the averaged parts
      int64_t largest_part = 0;  // and the buffers each micro-step's parts are received in
      for (size_t b = 0; b < buckets.size(); ++b) {
        const BucketLayout& bucket = buckets[b];
        const at::Tensor expected = averaged_bucket(bucket, reference_parameters);
        const int64_t part = bucket.part_elements(world.size);
        EXPECT_LE(testing::relative_error(reducer.averaged_parts()[b],
                                          expected.narrow(0, part * world.rank, part)),
                  compress_bf16 ? 1e-2 : 1e-6)
            << "bucket " << b;
        part_bytes += 4 * part;
        largest_part = std::max(largest_part, part);
      }
      // One receiving buffer of the largest part, or two taken in turn with overlap.
      const int64_t receiving_bytes = (compress_bf16 ? 2 : 4) * (overlap ? 2 : 1) * largest_part;
      EXPECT_EQ(counter.allocated_bytes(), part_bytes + receiving_bytes)
          << "only the parts (and the buffers they are received in) outlive backward";
      int64_t whole = 0;
      for (const at::Tensor& parameter : parameters) whole += 4 * parameter.numel();
      EXPECT_LT(part_bytes, whole) << "the test should shard something";
    }
  }
}

// A parameter that backward does not reach leaves its bucket incomplete: finish() makes it of
// zeros and reduce-scatters it in its turn, on every rank alike, as a zero gradient.
TEST(ReleasedReducer, ABucketThatBackwardLeavesIncompleteIsReducedAsZeros) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  const auto communicator = make_communicator(world);
  const std::vector<at::Tensor> parameters = {at::ones({4 * world.size}).requires_grad_(),
                                              at::ones({4 * world.size}).requires_grad_()};
  // A bucket of its own for each.
  const std::vector<BucketLayout> buckets =
      assign_buckets(parameters, {.bucket_mb = 1e-6, .first_bucket_mb = 1e-6}, world.size);
  ASSERT_EQ(buckets.size(), 2u);
  GradReducer reducer(parameters, buckets, *communicator,
                      {.overlap = false, .scatter = true, .release_buckets = true});
  reducer.set_sync(true);
  (parameters[0] * (world.rank + 1)).sum().backward();  // the second parameter is not reached
  reducer.finish();
  const double mean_rank = (world.size + 1) / 2.0;  // the average of rank + 1 over the ranks
  for (size_t b = 0; b < buckets.size(); ++b) {
    const double expected = buckets[b].members.front() == 0 ? mean_rank : 0.0;
    EXPECT_TRUE(at::allclose(reducer.averaged_parts()[b],
                             at::full({4}, expected, reducer.averaged_parts()[b].options())))
        << "bucket " << b << ": " << reducer.averaged_parts()[b];
  }
}

// Under ZeRO-1 each rank clips its part by the norm of the whole.
TEST(ClipByGlobalNorm, ThePartsOfEveryRankMakeOneNorm) {
  const auto communicator = make_communicator(world);
  // Rank r holds r + 1 in each of its 3 values.
  const at::Tensor part = at::full({3}, static_cast<float>(world.rank + 1));
  double squares = 0.0;
  for (int rank = 0; rank < world.size; ++rank) squares += 3.0 * (rank + 1) * (rank + 1);
  const at::Tensor norm = clip_by_global_norm({{part}, communicator.get()}, 1.0);
  EXPECT_NEAR(norm.item<double>(), std::sqrt(squares), 1e-5);
  EXPECT_NEAR(part[0].item<double>(), (world.rank + 1) / (std::sqrt(squares) + 1e-6), 1e-6);
}

const DataParallelOptions zero1_options = [] {
  DataParallelOptions options;
  options.buckets = small_buckets;
  options.zero1 = true;
  return options;
}();

TEST(Zero1AdamW, EachRankHoldsOneNthOfTheStateUpToPadding) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  Llama whole_model = fresh_model();
  const AdamW whole(hf_parameters(whole_model), {});

  Llama model = fresh_model();
  const auto communicator = make_communicator(world);
  const Zero1AdamW sharded(hf_parameters(model), *communicator, zero1_options);
  // The parameters moved into the optimizer's buckets, and kept their values.
  const std::vector<at::Tensor> original = whole_model->parameters();
  for (size_t i = 0; i < original.size(); ++i)
    EXPECT_TRUE(at::equal(model->parameters()[i], original[i])) << "parameter " << i;

  // Two fp32 moments per parameter value, and one step count.
  const int64_t values = whole_model->num_parameters();
  EXPECT_EQ(whole.state_bytes(), 8 * values + 4);
  // Each bucket pads to a multiple of the ranks: at most ranks - 1 values more per bucket.
  const auto buckets = static_cast<int64_t>(sharded.parts().size());
  const double share = static_cast<double>(8 * values) / world.size + 4;
  EXPECT_GE(static_cast<double>(sharded.state_bytes()), share);
  EXPECT_LE(static_cast<double>(sharded.state_bytes()), share + 8.0 * buckets);
  // The parts are as long on every rank.
  EXPECT_EQ(communicator->all_reduce_sum(static_cast<double>(sharded.state_bytes())),
            world.size * static_cast<double>(sharded.state_bytes()));
  // The memory plan's figures are these tensors', up to the padding and the step count.
  Config config;
  config.model = testing::tiny_config();
  config.dist.zero_stage = 1;
  const MemoryPlan plan = plan_memory(config, {.ranks = world.size, .device_memory = std::nullopt});
  EXPECT_EQ(plan.optimizer_unsharded + 4, static_cast<double>(whole.state_bytes()));
  EXPECT_NEAR(plan.optimizer, static_cast<double>(sharded.state_bytes()),
              8.0 * static_cast<double>(buckets) + 4);
  // The gradient buckets (each .grad is a view into one) and this rank's averaged parts.
  std::map<const void*, size_t> buckets_by_storage;
  for (const at::Tensor& parameter : model->parameters())
    buckets_by_storage[parameter.grad().storage().data()] = parameter.grad().storage().nbytes();
  int64_t gradient_bytes = 0;
  for (const auto& [storage, bytes] : buckets_by_storage)
    gradient_bytes += static_cast<int64_t>(bytes);
  for (const Zero1AdamW::Part& part : sharded.parts())
    gradient_bytes += static_cast<int64_t>(part.gradients.nbytes());
  EXPECT_NEAR(plan.gradients, static_cast<double>(gradient_bytes),
              8.0 * static_cast<double>(buckets * world.size));
}

// ZeRO-1 with its own model, as a run holds them.
struct ShardedRun {
  Llama model = fresh_model();
  std::unique_ptr<Communicator> communicator = make_communicator(world);
  Zero1AdamW optimizer{hf_parameters(model), *communicator, zero1_options};
};

// One step's order is the object's: an update before the gradients are reduced is refused.
TEST(Zero1AdamW, UpdatesOnlyAfterTheGradientsAreReduced) {
  ShardedRun run;
  EXPECT_THROW(run.optimizer.update(1e-2, at::zeros({})), std::logic_error);
  run.optimizer.reduce_gradients();
  EXPECT_THROW(run.optimizer.reduce_gradients(), std::logic_error) << "reduced twice";
  run.optimizer.update(1e-2, at::zeros({}));
}

TEST(Zero1AdamW, TheGatheredStateIsWholeOnRankZeroAndLoadsBackIntoEveryRanksPart) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  ShardedRun run;
  step_once(run.model, run.optimizer);
  // The all-gather gave every rank the same weights.
  EXPECT_TRUE(same_on_all_ranks(run.model->parameters(), *run.communicator));

  const OptimizerState state = run.optimizer.state();
  const std::filesystem::path saved = testing::mpi_test_directory() / "state";
  if (world.rank != 0) {
    EXPECT_TRUE(state.empty());
  } else {
    // The names and shapes of an unsharded AdamW's state, every moment touched by the step.
    const AdamW whole(hf_parameters(fresh_model()), {});
    ASSERT_EQ(state.size(), whole.state().size());
    for (const auto& [name, tensor] : whole.state()) {
      ASSERT_TRUE(state.contains(name)) << name;
      EXPECT_EQ(state.at(name).sizes(), tensor.sizes()) << name;
      if (name.ends_with(".step")) {
        EXPECT_EQ(state.at(name).item<float>(), 1.0f) << name;
      }
      if (name.ends_with(".exp_avg_sq")) {
        EXPECT_GT(state.at(name).min().item<float>(), 0.0f) << name;
      }
    }
    std::filesystem::create_directories(saved.parent_path());
    save_safetensors(saved, state);
  }
  run.communicator->all_reduce_sum(0.0);  // the file is there

  // Loaded on every rank into fresh optimizers, and gathered again: each part went to its place.
  ShardedRun resumed;
  resumed.optimizer.load_state(load_safetensors(saved), saved.string());
  const OptimizerState again = resumed.optimizer.state();
  if (world.rank == 0) {
    ASSERT_EQ(again.size(), state.size());
    for (const auto& [name, tensor] : state) EXPECT_TRUE(at::equal(again.at(name), tensor)) << name;
  }
}

// ZeRO-3 with its own model, whose units it runs, as a run holds them.
// With `gather_bf16`, its units are gathered in bf16, as under bf16 autocast.
struct FullyShardedRun {
  explicit FullyShardedRun(const ModelConfig& config = testing::tiny_config(),
                           bool gather_bf16 = false,
                           LlamaImpl::Weights weights = LlamaImpl::Weights::drawn)
      : model([&] {
          at::manual_seed(7);
          return Llama(config, Kernels::fused_cpu, weights);
        }()),
        optimizer(hf_parameters(model), model->unit_parameters(), *communicator, [&] {
          DataParallelOptions options;
          options.gather_bf16 = gather_bf16;
          return options;
        }()) {
    model->set_unit_hooks(optimizer.unit_hooks());
    optimizer.shard_weights();
  }

  Llama model;
  std::unique_ptr<Communicator> communicator = make_communicator(world);
  Zero3AdamW optimizer;
};

// Between steps a rank holds its part of every unit and no whole unit; the parts add up to the
// model, up to each unit's padding.
TEST(Zero3AdamW, EachRankHoldsItsPartOfTheWeightsAndNoWholeUnitBetweenSteps) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  FullyShardedRun run;
  const UnitShards& shards = run.optimizer.shards();
  EXPECT_EQ(shards.whole_units(), 0);
  // The tied embedding and the final norm are one unit, the first; each block one more.
  ASSERT_EQ(shards.units(), static_cast<size_t>(1 + testing::tiny_config().n_layers));
  int64_t part_values = 0;
  for (size_t u = 0; u < shards.units(); ++u) part_values += shards.part(u).numel();
  const int64_t values = run.model->num_parameters();
  EXPECT_GE(part_values * world.size, values);
  EXPECT_LT(part_values * world.size, values + static_cast<int64_t>(shards.units()) * world.size);
  EXPECT_EQ(run.communicator->all_reduce_sum(static_cast<double>(part_values)),
            static_cast<double>(world.size * part_values));
  // The moments are the parts' size too.
  EXPECT_EQ(run.optimizer.state_bytes(), 8 * part_values + 4);
  // The memory plan's weights are the parts and the units whole at once in a step (the tied
  // embedding's and two blocks'), up to the padding, besides the rotary tables.
  Config config;
  config.model = testing::tiny_config();
  config.dist.zero_stage = 3;
  const MemoryPlan plan = plan_memory(config, {.ranks = world.size, .device_memory = std::nullopt});
  EXPECT_TRUE(plan.weights_sharded);
  const double rotary = 8.0 * static_cast<double>(config.model.max_seq_len * config.model.head_dim);
  const int64_t whole_at_once = shards.layout(0).elements + 2 * shards.layout(1).elements;
  EXPECT_NEAR(plan.weights - rotary, 4.0 * static_cast<double>(part_values + whole_at_once),
              4.0 * static_cast<double>(shards.units() * world.size));
}

// A ZeRO-3 run's checkpoint of step 1, as every rank writes it: rank 0 begins it, each rank writes
// its share, and rank 0 finishes it once all have.
struct ShardedSave {
  explicit ShardedSave(const std::string& name) {
    config.model = testing::tiny_config();
    config.train.run_dir = (testing::mpi_test_directory() / name).string();
    progress.step = 1;
    progress.samples_consumed = 2 * world.size;
    progress.tokens_seen = 32 * world.size;
  }

  CheckpointContents contents_of(const FullyShardedRun& run) const {
    return checkpoint_contents(run.model, run.optimizer,
                               {.leader = world.rank == 0, .writing = world.size}, progress, config,
                               "", world.size, /*host_copy=*/false);
  }

  // Saves `contents` as the ranks of a run save it here (CheckpointStore::begin); returns the
  // checkpoint on rank 0.
  std::string save(const CheckpointContents& contents, Communicator& communicator) const {
    const CheckpointStore store(config.train.run_dir);
    if (world.rank == 0) store.begin(contents);
    communicator.all_reduce_sum(0.0);  // the files are there
    store.write_share(contents);
    communicator.all_reduce_sum(0.0);  // every share is written
    const std::string saved = world.rank == 0 ? store.finish(contents).string() : "";
    communicator.all_reduce_sum(0.0);  // the checkpoint is in its place
    return saved;
  }

  Config config;
  TrainingProgress progress;
};

// No rank gathers the model or the state to save them: each writes its own part of every unit's
// weights and moments (rank 0 also the step counts), a share that adds up to the model over the
// ranks, and no unit is whole at any time. The files hold exactly the weights and the state that
// gathering gives (make_whole, state()).
TEST(Zero3AdamW, EveryRankWritesItsPartsOfACheckpointAndNoneGathersTheModel) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  FullyShardedRun run;
  step_once(run.model, run.optimizer);
  UnitShards& shards = run.optimizer.shards();
  shards.reset_most_whole_units();

  const ShardedSave saving("zero3_save");
  const CheckpointContents contents = saving.contents_of(run);
  int64_t weight_values = 0;
  for (const TensorPiece& piece : contents.weights.pieces) weight_values += piece.values.numel();
  int64_t part_values = 0;
  for (size_t u = 0; u < shards.units(); ++u) part_values += shards.part(u).numel();
  EXPECT_LE(weight_values, part_values);
  EXPECT_EQ(run.communicator->all_reduce_sum(static_cast<double>(weight_values)),
            static_cast<double>(run.model->num_parameters()));
  const std::string saved = saving.save(contents, *run.communicator);
  EXPECT_EQ(shards.most_whole_units(), 0) << "a unit was gathered to save it";
  const std::filesystem::path checkpoint =
      std::filesystem::path(saving.config.train.run_dir) / "checkpoints" / "step_00000001";

  // Each rank of a fresh run reads its own parts of the state back, and only them: the reads
  // allocate at most one piece at a time, far from the whole state (8 bytes a parameter).
  FullyShardedRun resumed;
  {
    const SafetensorsReader file(checkpoint / "optimizer.safetensors");
    const CpuAllocationCounter counter;
    EXPECT_TRUE(resumed.optimizer.load_own_state(file, "optimizer.safetensors"));
    EXPECT_LT(counter.peak_bytes(), 8 * run.model->num_parameters() / world.size);
  }
  const OptimizerState state = run.optimizer.state();  // gathered, on rank 0
  const OptimizerState read_back = resumed.optimizer.state();
  const WholeWeights whole(run.optimizer);
  if (world.rank != 0) return;
  ASSERT_EQ(saved, checkpoint.string());
  verify_checkpoint(checkpoint);
  const NamedTensors weights = load_safetensors(checkpoint / "model.safetensors");
  const NamedTensors expected = hf_state_dict(run.model);
  ASSERT_EQ(weights.size(), expected.size());
  for (const auto& [name, tensor] : expected)
    EXPECT_TRUE(at::equal(weights.at(name), tensor)) << name;
  const NamedTensors moments = load_safetensors(checkpoint / "optimizer.safetensors");
  ASSERT_EQ(moments.size(), state.size());
  ASSERT_EQ(read_back.size(), state.size());
  for (const auto& [name, tensor] : state) {
    EXPECT_TRUE(at::equal(moments.at(name), tensor)) << name;
    EXPECT_TRUE(at::equal(read_back.at(name), tensor)) << name;
  }
}

// Reading parts is checked as reading a whole state is: a state file without an entry the run
// needs is one error naming the entry, and nothing of it is read.
TEST(Zero3AdamW, AStateFileThatLacksAnEntryIsRefusedBeforeAnyPartIsRead) {
  FullyShardedRun run;
  step_once(run.model, run.optimizer);
  OptimizerState state = run.optimizer.state();
  const std::filesystem::path file = testing::mpi_test_directory() / "lacking.safetensors";
  if (world.rank == 0) {
    state.erase("model.layers.1.mlp.down_proj.weight.exp_avg_sq");
    for (auto& [name, tensor] : state) tensor.fill_(7.0);
    std::filesystem::create_directories(file.parent_path());
    save_safetensors(file, state);
  }
  run.communicator->all_reduce_sum(0.0);  // the file is there
  FullyShardedRun fresh;
  try {
    fresh.optimizer.load_own_state(SafetensorsReader(file), "lacking.safetensors");
    ADD_FAILURE() << "read a state without an entry";
  } catch (const UserError& error) {
    EXPECT_STREQ(error.what(),
                 "lacking.safetensors: optimizer state "
                 "model.layers.1.mlp.down_proj.weight.exp_avg_sq is missing");
  }
  for (const PartsAdamW::Part& part : fresh.optimizer.parts()) {
    EXPECT_EQ(part.exp_avg.abs().max().item<float>(), 0.0f);
    EXPECT_EQ(part.exp_avg_sq.abs().max().item<float>(), 0.0f);
  }
}

// The model's unit hooks, seen from outside: after each position's before_forward, whether the
// next position's unit is on its way, and the units whole at once.
class WatchedHooks : public UnitHooks {
 public:
  WatchedHooks(std::shared_ptr<UnitHooks> hooks, const UnitShards& shards)
      : hooks_(std::move(hooks)), shards_(shards) {}
  void before_forward(size_t position) override {
    hooks_->before_forward(position);
    // Positions 0 .. n-1 of the embedding and n blocks: the next is block position + 1's unit.
    if (position + 1 < shards_.units()) next_on_its_way_.push_back(shards_.gathering(position + 1));
  }
  at::Tensor after_forward(size_t position, const at::Tensor& output,
                           bool backward_reads_parameters) override {
    return hooks_->after_forward(position, output, backward_reads_parameters);
  }
  std::vector<bool> next_on_its_way_;

 private:
  std::shared_ptr<UnitHooks> hooks_;
  const UnitShards& shards_;
};

// Prefetch: while a block runs forward, the next block's all-gather is in flight (started before
// the block computes, waited for when the next one begins). At most two units are whole at once
// besides the tied embedding's, in forward and in backward, with and without recomputation.
TEST(UnitShards, TheNextUnitIsGatheredWhileOneRunsAndAtMostTwoBlocksAreWhole) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  ModelConfig config = testing::tiny_config();
  config.n_layers = 5;
  for (const bool recompute : {false, true}) {
    FullyShardedRun run(config);
    UnitShards& shards = run.optimizer.shards();
    const auto watched = std::make_shared<WatchedHooks>(run.optimizer.unit_hooks(), shards);
    run.model->set_unit_hooks(watched);
    run.model->set_activation_checkpointing(recompute);
    shards.reset_most_whole_units();
    run.optimizer.set_sync(true);
    backward_on(run.model, windows_of(world.rank));
    EXPECT_EQ(shards.whole_units(), 0) << "every unit freed once backward is over";
    run.optimizer.reduce_gradients();
    EXPECT_LE(shards.most_whole_units(), 3) << "the embedding's unit and two blocks";
    EXPECT_GE(shards.most_whole_units(), 2);
    ASSERT_EQ(watched->next_on_its_way_.size(), shards.units() - 1);
    for (size_t p = 0; p < watched->next_on_its_way_.size(); ++p)
      EXPECT_TRUE(watched->next_on_its_way_[p]) << "position " << p << ", recompute " << recompute;
    run.optimizer.update(1e-2, at::zeros({}));
  }
}

// A micro-step gathers each unit before its forward and each block again before its backward;
// the head, last, stays whole from its forward to its backward, and the embedding is not gathered
// for its backward, which needs only the tokens: tied, it stays whole for the head anyway; untied,
// one all-gather of the vocabulary's rows a micro-step is saved (Llama 3 8B's: 1 GB in bf16).
TEST(UnitShards, TheEmbeddingIsNotGatheredForItsBackward) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  for (const bool tied : {true, false}) {
    for (const bool recompute : {false, true}) {
      ModelConfig config = testing::tiny_config();
      config.n_layers = 3;
      config.tie_word_embeddings = tied;
      FullyShardedRun run(config);
      run.model->set_activation_checkpointing(recompute);
      const UnitShards& shards = run.optimizer.shards();
      const auto units = static_cast<int64_t>(shards.units());
      ASSERT_EQ(units, tied ? 1 + 3 : 1 + 3 + 1);
      const int64_t before = shards.gathers();
      run.optimizer.set_sync(true);
      backward_on(run.model, windows_of(world.rank));
      // Forward: every unit once; backward: the 3 blocks.
      EXPECT_EQ(shards.gathers() - before, units + 3)
          << (tied ? "tied" : "untied") << ", recompute " << recompute;
      run.optimizer.reduce_gradients();
      run.optimizer.update(1e-2, at::zeros({}));
    }
  }
}

// A fill that throws on one rank throws on every rank before the unit's parts change: the units
// before it filled, that one and those after as they were (zeros), and none left whole.
TEST(UnitShards, AFillThatFailsOnOneRankEndsEveryRankAlike) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  FullyShardedRun filled(testing::tiny_config(), false, LlamaImpl::Weights::none);
  const UnitShards& shards = filled.optimizer.shards();
  ASSERT_GE(shards.units(), 2u);
  int64_t unit = 0;
  std::string error;
  try {
    filled.optimizer.fill_weights(filled.model->parameters(),
                                  [&](const std::vector<at::Tensor>& parameters) {
                                    if (unit++ == 1 && world.rank == world.size - 1)
                                      throw UserError("no such file");
                                    filled.model->initialize(parameters);
                                  });
  } catch (const std::exception& failure) {
    error = failure.what();
  }
  EXPECT_EQ(error, world.rank == world.size - 1 ? "no such file"
                                                : "another rank could not fill its weights");
  EXPECT_EQ(unit, 2);
  EXPECT_NE(filled.optimizer.parts()[0].weights.abs().sum().item<double>(), 0.0);
  for (size_t u = 1; u < shards.units(); ++u)
    EXPECT_EQ(filled.optimizer.parts()[u].weights.abs().sum().item<double>(), 0.0) << u;
  EXPECT_EQ(shards.whole_units(), 0);
}

// The dtype of every parameter of `model`.
std::set<at::ScalarType> dtypes_of(const Llama& model) {
  std::set<at::ScalarType> dtypes;
  for (const at::Tensor& parameter : model->parameters()) dtypes.insert(parameter.scalar_type());
  return dtypes;
}

// One forward and backward under bf16 autocast, its gradients reduced; returns the most bytes the
// CPU allocator held meanwhile beyond what it held before.
int64_t bf16_step_peak(FullyShardedRun& run) {
  const CpuAllocationCounter counter;
  run.optimizer.set_sync(true);
  {
    const AutocastGuard autocast(c10::Device(c10::kCPU), /*enabled=*/true);
    const at::Tensor windows = windows_of(world.rank);
    const at::Tensor loss =
        next_token_loss(run.model(windows.narrow(1, 0, 16)), windows.narrow(1, 1, 16));
    loss.backward();
  }
  run.optimizer.reduce_gradients();
  return counter.peak_bytes();
}

// Under bf16 autocast the units are all-gathered in bf16 (FSDP's param_dtype): while the ranks
// train, the parameters are bf16 views, which autocast takes as they are, so that no rank keeps
// autocast's bf16 casts of the whole model from forward to backward, as gathering in fp32 does;
// kept whole, they are the fp32 weights exactly. The gradients each rank receives are those of the
// weights rounded to bf16: within bf16's precision of fp32 gathering's, and not equal to them.
TEST(UnitShards, UnderBf16TheUnitsAreGatheredAndRunInBf16AndKeptWholeInFp32) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  ModelConfig config = testing::tiny_config();
  config.n_layers = 5;
  FullyShardedRun in_fp32(config);
  FullyShardedRun in_bf16(config, /*gather_bf16=*/true);
  EXPECT_EQ(dtypes_of(in_bf16.model), std::set{at::kBFloat16});
  {
    const WholeWeights bf16_whole(in_bf16.optimizer);
    const WholeWeights fp32_whole(in_fp32.optimizer);
    EXPECT_EQ(dtypes_of(in_bf16.model), std::set{at::kFloat});
    const std::vector<at::Tensor> expected = in_fp32.model->parameters();
    const std::vector<at::Tensor> kept = in_bf16.model->parameters();
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(at::equal(kept[i], expected[i])) << i;
  }
  EXPECT_EQ(dtypes_of(in_bf16.model), std::set{at::kBFloat16});

  const int64_t fp32_peak = bf16_step_peak(in_fp32);
  const int64_t bf16_peak = bf16_step_peak(in_bf16);
  const int64_t parameters = in_fp32.model->num_parameters();
  EXPECT_GE(fp32_peak - bf16_peak, 2 * parameters)
      << "gathered in fp32 a step holds " << fp32_peak << " bytes, in bf16 " << bf16_peak;

  for (size_t u = 0; u < in_fp32.optimizer.parts().size(); ++u) {
    const at::Tensor& expected = in_fp32.optimizer.parts()[u].gradients;
    const at::Tensor& seen = in_bf16.optimizer.parts()[u].gradients;
    EXPECT_EQ(seen.scalar_type(), at::kFloat);
    EXPECT_LE(testing::relative_error(seen, expected), 2e-2) << "unit " << u;
    EXPECT_FALSE(at::equal(seen, expected)) << "unit " << u;
  }
}

// A model made without bytes is given its weights a unit at a time (the set-up's draw or load,
// a rollback's): no more than one unit is ever whole and rank 0's values are every rank's, so
// that the parts equal those of the model drawn whole and then cut, gathered in fp32 or in bf16.
TEST(UnitShards, AModelMadeWithoutBytesIsFilledAUnitAtATimeWithRankZerosValues) {
  ASSERT_GE(world.size, 2) << "run under mpirun -n 2 or more";
  ModelConfig config = testing::tiny_config();
  config.n_layers = 4;
  for (const bool gather_bf16 : {false, true}) {
    FullyShardedRun drawn(config, gather_bf16);
    FullyShardedRun filled(config, gather_bf16, LlamaImpl::Weights::none);
    UnitShards& shards = filled.optimizer.shards();
    EXPECT_EQ(shards.whole_units(), 0);
    int64_t largest_unit = 0;
    for (size_t u = 0; u < shards.units(); ++u)
      largest_unit = std::max(largest_unit, shards.layout(u).elements);
    int64_t most_whole = 0;
    int64_t fills = 0;
    const CpuAllocationCounter counter;
    filled.optimizer.fill_weights(filled.model->parameters(),
                                  [&](const std::vector<at::Tensor>& parameters) {
                                    most_whole = std::max(most_whole, shards.whole_units());
                                    ++fills;
                                    filled.model->initialize(parameters);
                                    // Another rank's values are overwritten by rank 0's.
                                    if (world.rank != 0) {
                                      at::NoGradGuard no_grad;
                                      for (const at::Tensor& parameter : parameters)
                                        parameter.add_(1.0);
                                    }
                                  });
    EXPECT_EQ(fills, static_cast<int64_t>(shards.units()));
    EXPECT_LE(most_whole, 1) << "whole units at once while filling";
    EXPECT_EQ(shards.whole_units(), 0);
    // One unit whole in fp32 (and, gathered in bf16, once more at half the bytes), and nothing of
    // the others.
    EXPECT_LE(counter.peak_bytes(), (gather_bf16 ? 6 : 4) * largest_unit + 1024)
        << "bytes held at once while filling";
    EXPECT_LT(counter.peak_bytes(), 4 * filled.model->num_parameters());
    for (size_t u = 0; u < shards.units(); ++u) {
      EXPECT_TRUE(
          at::equal(filled.optimizer.parts()[u].weights, drawn.optimizer.parts()[u].weights))
          << "unit " << u << (gather_bf16 ? " in bf16" : " in fp32");
    }
    // Kept whole, the weights are the model drawn whole.
    const WholeWeights drawn_whole(drawn.optimizer);
    const WholeWeights filled_whole(filled.optimizer);
    const std::vector<at::Tensor> expected = drawn.model->parameters();
    const std::vector<at::Tensor> weights = filled.model->parameters();
    for (size_t k = 0; k < weights.size(); ++k)
      EXPECT_TRUE(at::equal(weights[k], expected[k])) << "parameter " << k;
  }
}

}  // namespace
}  // namespace mltrain
