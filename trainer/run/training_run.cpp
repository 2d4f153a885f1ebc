#include "trainer/run/training_run.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <utility>

#include "common/atomic_file.h"
#include "common/directory_lock.h"
#include "common/error.h"
#include "common/file_tree.h"
#include "common/input_file.h"
#include "data/loader.h"
#include "dist/flight_recorder.h"
#include "dist/grad_reducer.h"
#include "dist/hybrid_communicator.h"
#include "model/interop/hf_checkpoint.h"
#include "model/interop/hf_state_dict.h"
#include "trainer/checkpoint/checkpoint_store.h"
#include "trainer/checkpoint/checkpoint_writer.h"
#include "trainer/machine/compute_settings.h"
#include "trainer/machine/cpu_allocation_counter.h"
#include "trainer/machine/device.h"
#include "trainer/machine/precision.h"
#include "trainer/optim/optimizer.h"
#include "trainer/report/loss_plot.h"
#include "trainer/report/metrics_log.h"
#include "trainer/report/step_profiler.h"
#include "trainer/report/tensorboard_log.h"
#include "trainer/run/checkpoint_lineage.h"
#include "trainer/run/evaluation.h"
#include "trainer/run/memory_plan.h"
#include "trainer/run/run_data.h"
#include "trainer/run/run_schedule.h"
#include "trainer/run/stop_signal.h"
#include "trainer/run/train_step.h"
#include "trainer/run/wall_clock.h"

namespace mltrain {
namespace {

// The first line of the effective config that a run writes to RUN_DIR/config.yaml; a file there
// that does not begin with its first words is not one mltrain wrote.
constexpr std::string_view kEffectiveConfigHeader =
    "# The effective config of this run, which mltrain writes here at each start: keep a config "
    "of your own elsewhere\n";
constexpr std::string_view kEffectiveConfigMark = "# The effective config of this run";

// What holds RUN_DIR/config.yaml and is not a config mltrain wrote there (a user's own config kept
// in the run directory, a directory) is moved aside, not written over. Effective configs of runs
// before the header are moved aside once.
void make_way_for_effective_config(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_regular_file(std::filesystem::symlink_status(path, error)) &&
      read_text_file(path, "the run's config").starts_with(kEffectiveConfigMark))
    return;
  if (const auto aside = move_aside(path)) {
    spdlog::warn(
        "{} is not a config mltrain wrote (one of yours?): kept as {}, and the run's effective "
        "config is written in its place",
        path.string(), aside->filename().string());
  }
}

std::string duration_text(double seconds) {
  const auto total = static_cast<int64_t>(std::lround(seconds));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, total % 3600 / 60);
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

// Copies device values to the host, which on CUDA waits for the device's queue to drain. Recorded
// as "mltrain::read_device" for profilers, and for the test that steps which do not log or
// checkpoint never read.
at::Tensor read_to_host(const at::Tensor& values) {
  RECORD_FUNCTION("mltrain::read_device", std::vector<c10::IValue>());
  return values.to(at::kCPU).contiguous();
}

// A step's loss and gradient norm, read by the host, and the mean wall time of the steps read
// with it: on CUDA a step's own host time is only the time to enqueue it.
struct StepValues {
  double loss;
  double grad_norm;
  double seconds_per_step;
  bool skipped;       // non-finite, or a loss spike
  double loss_level;  // the spike guard's, that the step was judged by
};

// What read_steps reads of each step: its loss, gradient norm, skip flag and spike-guard level.
constexpr size_t kValuesPerStep = 4;

// Whether this process's parent is an mpirun (Open MPI's, or another's by its name): the process
// that stops every rank at once. Under srun, or on a node of its own, the parent is another.
bool launched_by_mpirun() {
  std::string parent;
  try {
    parent = read_text_file(fmt::format("/proc/{}/comm", ::getppid()), "kernel file");
  } catch (const std::exception&) {
    return false;
  }
  parent = parent.substr(0, parent.find('\n'));
  return parent == "mpirun" || parent == "mpiexec" || parent == "orterun" || parent == "prterun";
}

// model.init_from: a fresh run's weights come from a Hugging Face directory whose config.json
// matches the model.
void check_init_from(const std::string& directory, const ModelConfig& model) {
  if (!is_hf_model_directory(directory)) {
    throw UserError(fmt::format(
        "model.init_from {}: not a Hugging Face model directory (config.json with "
        "model.safetensors or model.safetensors.index.json, as save_pretrained writes them)",
        directory));
  }
  check_hf_model_config(model, directory);
}

// The file in RUN_DIR/flight by which the ranks see that they share it.
constexpr const char* kFlightToken = "run_token";

// Whether `path` is a directory of a run's flight records: its token is in it.
bool holds_flight_records(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_directory(std::filesystem::symlink_status(path, error)) &&
         std::filesystem::is_regular_file(
             std::filesystem::symlink_status(path / kFlightToken, error));
}

// Moves what is at `path` aside, saying so: a file of the user's where the run keeps its records.
void keep_aside(const std::filesystem::path& path) {
  if (const auto aside = move_aside(path)) {
    spdlog::warn("{} is not a run's flight records (one of yours?): kept as {}", path.string(),
                 aside->filename().string());
  }
}

// Rank 0's side of opening RUN_DIR/flight: the records of an earlier run that left some move to
// flight.previous, in place of the records there before (a run that left none leaves
// flight.previous to the last that did), and this run's `token` is written. What stands at either
// name and is not a directory of records (a user's file) is moved aside, never removed.
void prepare_flight_directory(const std::filesystem::path& run_dir, const std::string& token) {
  const std::filesystem::path directory = run_dir / "flight";
  const std::filesystem::path previous = run_dir / "flight.previous";
  std::error_code error;
  if (std::filesystem::exists(std::filesystem::symlink_status(directory, error)) &&
      !std::filesystem::is_directory(std::filesystem::symlink_status(directory, error)))
    keep_aside(directory);
  std::error_code missing;
  for (const auto& entry : std::filesystem::directory_iterator(directory, missing)) {
    if (entry.path().filename() == kFlightToken) continue;
    if (holds_flight_records(previous)) {
      remove_tree(previous);
    } else {
      keep_aside(previous);
    }
    std::filesystem::rename(directory, previous);
    break;
  }
  std::filesystem::create_directories(directory);
  write_file_atomically(directory / kFlightToken, token);
}

// optim.name muon: Muon's settings; adamw: none.
std::optional<MuonOptions> muon_options(const OptimConfig& optim) {
  if (optim.name != "muon") return std::nullopt;
  return MuonOptions{.momentum = optim.muon_momentum,
                     .ns_steps = optim.muon_ns_steps,
                     .weight_decay = optim.weight_decay};
}

// Muon's learning rate follows the schedule of optim.lr, scaled to optim.muon_lr at the peak
// (optim.muon_lr 0: optim.lr itself; with optim.lr 0, nothing trains).
double muon_lr_ratio(const OptimConfig& optim) {
  if (optim.muon_lr == 0.0) return 1.0;
  return optim.lr > 0 ? optim.muon_lr / optim.lr : 0.0;
}

// Through the optimizer, which under ZeRO-3 takes them a unit at a time.
void load_init_from(Llama& model, Optimizer& optimizer, const std::string& directory) {
  check_init_from(directory, model->config());
  const WeightFiles files = open_hf_model(model->config(), directory);
  optimizer.fill_weights(model->parameters(), [&](const std::vector<at::Tensor>& parameters) {
    load_hf_weights(model, files, parameters);
  });
  spdlog::info("starting from the weights of {} (model.init_from)", directory);
}

// One training run, from set-up to the last step.
class TrainingRun {
 public:
  TrainingRun(const Config& config, const std::string& resume, const World& world,
              const TrainingHooks& hooks);
  void run();

 private:
  void check_data();
  void open_flight_records();
  void check_memory_plan();
  void prepare_run_directory(const std::string& resume);
  void build_model();
  void build_optimizer();
  void restore_state(const std::string& resume);
  void agree_on_config();
  void agree_on_weights();
  void start_data();
  void open_outputs();
  void open_profiler();
  void announce();
  void announce_sources();
  void announce_document_masking();
  void announce_loss_masks();
  void record_blend();
  void record_step(const StepResult& result);
  std::optional<StepValues> read_steps();
  bool count_skipped_step(int64_t step, const StepValues& values);
  void roll_back(int64_t step, const std::string& bad_steps);
  std::vector<int64_t> checkpoints_at_hand() const;
  std::filesystem::path checkpoint_of(int64_t step) const;
  void set_aside_bad(const std::vector<int64_t>& bad, std::optional<int64_t> instead);
  [[noreturn]] void stop_with_no_checkpoint_left(int64_t step, const std::string& bad_steps);
  std::optional<std::string> name_last_good();
  void checkpoint_when_due(int64_t step);
  void log_step(const StepResult& result, const StepValues& values);
  void evaluate_now(int64_t step);
  std::optional<std::filesystem::path> save_checkpoint();
  bool any_rank_asked_to_stop();
  void settle_stop_vote();
  void note_write_failure();
  int64_t peak_memory() const;
  // ZeRO-3's: the model is made without bytes and filled a unit at a time (build_model).
  bool weights_without_bytes() const { return shards_weights(config_, world_.size); }
  std::optional<std::filesystem::path> settle_checkpoint_writes();
  [[noreturn]] void fail_write(const std::string& failure) const;

  const Config& config_;
  const World& world_;
  const TrainingHooks& hooks_;
  const bool leader_;  // rank 0 writes the run directory
  // Rank 0's, taken first: a second run on the directory stops before anything is done.
  const std::unique_ptr<DirectoryLock> run_dir_lock_;
  const c10::Device device_;
  const PrecisionChoice precision_;
  const BatchLayout layout_;
  // With train.cpu_memory allocator on the CPU: what the run's tensors hold, from the start.
  const std::unique_ptr<CpuAllocationCounter> cpu_allocations_;
  std::unique_ptr<Communicator> communicator_;
  // With dist.shard_ranks, what the optimizer shards within each group of ranks and averages
  // across them (hybrid_communicator.h): declared before the optimizer, which uses it.
  std::unique_ptr<Communicator> shard_groups_;
  // With data.document_masking, where documents begin: found before the data is read.
  const std::optional<int64_t> document_start_;
  std::vector<RunSource> sources_;  // the corpora, whole before any pointer to them is taken
  BlendResume blend_start_;         // where the blend's current weights began, and unlisted sources
  std::optional<BlendedSampler> blend_;  // the training order, for the checkpoints' counts
  std::filesystem::path run_dir_;
  CheckpointStore checkpoints_;
  CheckpointWriter checkpoint_writer_;  // rank 0's saves; waits for a background write on exit
  std::string tokenizer_model_;         // the tokenizer file's bytes, read at the start (rank 0's)
  Llama model_{nullptr};
  std::vector<at::Tensor> parameters_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Loader> loader_;
  std::optional<SpikeGuard> spike_guard_;  // its level starts at the checkpoint's
  std::optional<StepParts> step_parts_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<StepProfiler> profiler_;       // rank 0's
  std::unique_ptr<TensorBoardLog> tensorboard_;  // rank 0's, with train.tensorboard
  TrainingProgress progress_;
  std::optional<RunSchedule> schedule_;  // known once the resumed step is
  int64_t tokens_per_step_ = 0;
  double flops_per_token_ = 0.0;
  Clock::time_point start_;
  double timed_seconds_ = 0.0;  // wall time of the steps after the run's first (its warm-up)
  int64_t timed_steps_ = 0;
  Clock::time_point unread_since_;  // when the first of the unread steps started
  std::vector<StepResult> unread_;  // steps whose loss and gradient norm the host has not read
  int64_t bad_steps_in_a_row_ = 0;
  // A checkpoint due while steps were skipped waits for the first step applied after them.
  bool checkpoint_postponed_ = false;
  // Which of the run's checkpoints are good, and where a rollback goes: the run's own, not
  // `latest`, which may name another run's.
  std::optional<CheckpointLineage> lineage_;
  std::optional<int64_t> resumed_step_;  // the checkpoint the run started from, if any
  std::filesystem::path resumed_from_;
  std::string write_failure_;  // this rank's failed background write, until every rank knows
  // Whether every rank sees rank 0's run directory, and so writes its share of each checkpoint
  // there; else rank 0 gathers everything and writes it alone.
  bool run_dir_shared_ = true;
  std::unique_ptr<PendingSum> stop_vote_;  // the ranks' stop flags of the step before
};

// The members first: rank 0's lock on the run directory, taken before anything else, then the
// device, its precision, the batch layout, the communicator and the data's windows, which every
// build step below may need.
TrainingRun::TrainingRun(const Config& config, const std::string& resume, const World& world,
                         const TrainingHooks& hooks)
    : config_(config),
      world_(world),
      hooks_(hooks),
      leader_(world.rank == 0),
      run_dir_lock_(leader_
                        ? std::make_unique<DirectoryLock>(
                              config.train.run_dir, DirectoryLock::Names{.lock_file = "run.lock",
                                                                         .owner = "training run",
                                                                         .setting = "train.run_dir",
                                                                         .keep_lock_file = true})
                        : nullptr),
      device_(rank_device(config.train.device, world)),
      precision_(precision_on_this_machine(config.train.precision, device_)),
      layout_{config.data.micro_batch, config.data.grad_accum, world.size},
      cpu_allocations_(device_.is_cpu() && config.train.cpu_memory == "allocator"
                           ? std::make_unique<CpuAllocationCounter>()
                           : nullptr),
      communicator_(make_communicator(world, device_, config.dist.backend,
                                      static_cast<double>(config.dist.timeout_s),
                                      config.dist.rendezvous)),
      document_start_(document_start(config)),
      sources_(open_sources(config)),
      run_dir_(config.train.run_dir),
      checkpoints_(run_dir_),
      checkpoint_writer_(checkpoints_, world.rank, config.train.async_checkpoint,
                         std::chrono::seconds(config.dist.timeout_s),
                         hooks.during_checkpoint_write) {
  // The build steps, in the order their needs give. Each says what it needs.
  check_data();
  open_flight_records();
  agree_on_config();
  check_memory_plan();
  prepare_run_directory(resume);
  build_model();
  build_optimizer();
  restore_state(resume);
  agree_on_weights();
  start_data();
  open_outputs();
}

// Needs the opened windows. The data checks: the global batch fits the training windows, and the
// tokenizer the model's vocabulary.
void TrainingRun::check_data() {
  check_batch_fits(layout_, sources_);
  tokens_per_step_ = layout_.global_batch() * config_.data.seq_len;
  check_tokenizer(config_);
  // Read once, so that every checkpoint carries the tokenizer the run started with, whatever
  // becomes of the file meanwhile.
  if (leader_) tokenizer_model_ = read_tokenizer_model(config_);
}

// Needs the communicator and rank 0's lock on the run directory, and comes before the collectives
// of the set-up: a collective that fails from here on writes every live rank's flight record to
// RUN_DIR/flight, where the others can read it only if they share the directory (as resuming
// from its checkpoints needs too). Rank 0 moves an earlier run's records aside and writes a token
// of this run there; a rank that does not read the same token warns and keeps its records to
// itself, rather than have a failure name every rank on other nodes as gone. All ranks stop if
// rank 0 cannot write.
void TrainingRun::open_flight_records() {
  if (world_.size == 1) return;
  const std::filesystem::path directory = run_dir_ / "flight";
  const double token = static_cast<double>(std::random_device()() >> 1) + 1.0;
  std::string failure;
  if (leader_) {
    try {
      prepare_flight_directory(run_dir_, fmt::format("{:.0f}", token));
    } catch (const std::filesystem::filesystem_error& error) {
      failure = error.what();
    }
  }
  if (communicator_->all_reduce_sum(failure.empty() ? 0.0 : 1.0) > 0) {
    throw std::runtime_error(
        leader_ ? fmt::format("cannot prepare the run's flight records: {}", failure)
                : "rank 0 could not prepare the run's flight records");
  }
  // Also the barrier before which no rank reads the token or looks for a request.
  const double rank0_token = communicator_->all_reduce_sum(leader_ ? token : 0.0);
  std::error_code unread;
  const bool shared = std::filesystem::exists(directory / kFlightToken, unread) &&
                      read_text_file(directory / kFlightToken, "flight token") ==
                          fmt::format("{:.0f}", rank0_token);
  if (!shared) {
    spdlog::warn(
        "this rank does not share train.run_dir ({}) with rank 0: should a collective fail, the "
        "ranks cannot gather their flight records, and --resume needs rank 0's checkpoints on "
        "every rank; give the ranks a directory they share",
        std::filesystem::absolute(run_dir_).string());
  } else {
    communicator_->flight().write_records_to(directory);
  }
  run_dir_shared_ = communicator_->all_reduce_sum(shared ? 0.0 : 1.0) == 0;
  if (leader_ && !run_dir_shared_) {
    spdlog::warn(
        "not every rank shares train.run_dir: rank 0 gathers each checkpoint and writes it alone, "
        "where the ranks would write their own parts");
  }
}

// Needs the device, the precision and the communicator, and comes before anything large is
// allocated: a run that cannot fit stops here, saying what would fit. All ranks stop or none: one
// rank that stopped alone would leave the others waiting for it.
void TrainingRun::check_memory_plan() {
  const MemoryPlan memory_plan = plan_memory(
      config_, {.ranks = world_.size,
                .cuda = device_.is_cuda(),
                .bf16 = precision_.bf16,
                .device_memory = static_cast<double>(memory_per_rank(device_, world_.local_size))});
  if (leader_) spdlog::info("{}", describe(memory_plan));
  const std::string shortfall = memory_shortfall(memory_plan, config_);
  if (communicator_->all_reduce_sum(shortfall.empty() ? 0.0 : 1.0) > 0) {
    const std::string why =
        shortfall.empty() ? "another rank's memory plan does not fit its memory" : shortfall;
    if (config_.train.check_memory)
      throw UserError(why + "; train.check_memory=false starts it all the same");
    spdlog::warn("{}", why);
  }
}

// Needs the run directory's lock (rank 0's): the temporaries of an interrupted save are this
// run's to remove, as no other run owns the directory. A run that is surely fresh checks where
// its weights come from before it makes anything.
void TrainingRun::prepare_run_directory(const std::string& resume) {
  if (resume.empty() && !config_.init_from.empty())
    check_init_from(config_.init_from, config_.model);
  if (leader_) checkpoints_.prepare_for_saving();
}

// Needs the device: the seeded initial weights (rank 0's are broadcast later), the kernels for
// the device, and activation checkpointing.
void TrainingRun::build_model() {
  at::manual_seed(config_.data.seed);
  // Under ZeRO-3 without bytes: restore_state draws or loads them a unit at a time, each rank
  // keeping its part, so that no rank ever holds the whole model.
  model_ = Llama(config_.model, choose_kernels(config_.train.kernels, device_),
                 weights_without_bytes() ? LlamaImpl::Weights::none : LlamaImpl::Weights::drawn,
                 device_, config_.lora);
  model_->to(device_);
  model_->set_activation_checkpointing(config_.train.activation_checkpointing);
  parameters_ = model_->parameters();
  flops_per_token_ =
      training_flops_per_token(config_.model, model_->num_parameters(), config_.data.seq_len);
  // With LoRA the frozen weights take no weight-gradient product in backward: 4 FLOPs a token
  // each, not 6.
  if (config_.lora.enabled())
    flops_per_token_ -= 2.0 * static_cast<double>(config_.model.parameters());
}

// Needs the model on its device (the optimizer's state and buckets live beside the weights; under
// ZeRO-1 the weights move into its buckets, under ZeRO-3 into its units, whose hooks the model
// then calls) and the communicator.
void TrainingRun::build_optimizer() {
  const bool sharded = shards_optimizer(config_, world_.size);
  if (config_.dist.zero_stage >= 1 && !sharded) {
    spdlog::info(
        "dist.zero_stage {} with one rank to {}: nothing to shard, the optimizer runs whole",
        config_.dist.zero_stage, world_.size == 1 ? "the run" : "a group (dist.shard_ranks 1)");
  }
  const int shard_ranks = shard_group_size(config_, world_.size);
  if (sharded && shard_ranks < world_.size) {
    shard_groups_ = make_hybrid_communicator(*communicator_, shard_ranks);
    spdlog::info(
        "dist.shard_ranks {}: {} groups of {} ranks, each sharding one replica among its ranks, "
        "their gradients averaged across the groups",
        shard_ranks, world_.size / shard_ranks, shard_ranks);
  }
  // With LoRA the adapters alone: the frozen weights have no gradient, state or reduction.
  NamedParameters trained = hf_parameters(model_);
  std::erase_if(trained,
                [](const NamedParameter& parameter) { return !parameter.tensor.requires_grad(); });
  optimizer_ =
      make_optimizer(trained, shard_groups_ ? *shard_groups_ : *communicator_,
                     {.buckets = {.bucket_mb = config_.dist.bucket_mb},
                      .overlap = overlap_all_reduce(config_.dist.overlap, device_),
                      .compress_bf16 = config_.dist.grad_dtype == "bf16" && world_.size > 1,
                      .zero1 = sharded,
                      .shard_gradients = shards_gradients(config_, world_.size),
                      .shard_weights = shards_weights(config_, world_.size),
                      .gather_bf16 = precision_.bf16,
                      .adamw = {config_.optim.beta1, config_.optim.beta2, config_.optim.eps,
                                config_.optim.weight_decay},
                      .muon = muon_options(config_.optim),
                      .muon_lr_ratio = muon_lr_ratio(config_.optim)},
                     model_->unit_parameters());
  model_->set_unit_hooks(optimizer_->unit_hooks());
}

// Needs the model and the optimizer: a checkpoint fills both and says where the run is; a fresh
// run with model.init_from takes that directory's weights. The schedule starts at that step.
void TrainingRun::restore_state(const std::string& resume) {
  if (const auto resumed = checkpoints_.resume(resume, model_, *optimizer_, config_)) {
    progress_ = *resumed;
    resumed_from_ = resume == "auto" ? *checkpoints_.latest() : std::filesystem::path(resume);
    resumed_step_ = progress_.step;
    lineage_.emplace(progress_.step);
    if (!config_.init_from.empty()) {
      spdlog::info(
          "model.init_from ({}) is not used: a resumed run continues from its checkpoint's "
          "weights",
          config_.init_from);
    }
  } else if (!config_.init_from.empty()) {
    // Every rank loads and checks the directory, so that a bad one fails on all of them alike;
    // rank 0's weights are broadcast all the same.
    load_init_from(model_, *optimizer_, config_.init_from);
  } else if (weights_without_bytes()) {
    optimizer_->fill_weights(parameters_, [&](const std::vector<at::Tensor>& parameters) {
      model_->initialize(parameters);
    });
  }
  if (!lineage_) lineage_.emplace(std::nullopt);
  schedule_.emplace(config_.train, progress_.step);
  blend_start_ = resume_blend(sources_, progress_, config_, layout_);
}

// Needs the restored progress (the loader starts at the samples consumed, the spike guard at its
// level) and the schedule: the loader, and what the step works with.
void TrainingRun::start_data() {
  spike_guard_.emplace(config_.train.spike_guard, progress_.loss_level, device_);
  blend_.emplace(blend_of(sources_, config_, layout_, blend_start_.segment));
  std::vector<const TokenWindows*> train_windows;
  for (const RunSource& source : sources_) train_windows.push_back(&*source.train);
  loader_ = std::make_unique<Loader>(std::move(train_windows), *blend_, world_.rank,
                                     progress_.samples_consumed, config_.data.prefetch,
                                     device_.is_cuda());
  step_parts_.emplace(StepParts{.model = model_,
                                .loader = *loader_,
                                .optimizer = *optimizer_,
                                .communicator = *communicator_,
                                .spike_guard = *spike_guard_,
                                .optim = config_.optim,
                                .max_steps = schedule_->max_steps(),
                                .grad_accum = layout_.grad_accum,
                                .device = device_,
                                .bf16 = precision_.bf16,
                                .document_start = document_start_,
                                .rank = world_.rank,
                                .hooks = hooks_});
}

// Last, so that a run that failed to set up leaves the directory's config and metrics as they
// were: rank 0 writes the effective config and appends to the metrics.
void TrainingRun::open_outputs() {
  if (!leader_) return;
  make_way_for_effective_config(run_dir_ / "config.yaml");
  write_file_atomically(
      run_dir_ / "config.yaml",
      std::string(kEffectiveConfigHeader) + config_to_yaml(with_absolute_data_paths(config_)));
  metrics_ = std::make_unique<MetricsLog>(run_dir_ / "metrics.jsonl");
  if (config_.train.tensorboard)
    tensorboard_ = std::make_unique<TensorBoardLog>(run_dir_ / "tensorboard");
  open_profiler();
}

// Needs the schedule: a range outside the steps this run trains is said at once, not found empty
// at the end. Rank 0 traces its own steps.
void TrainingRun::open_profiler() {
  const std::optional<StepRange> steps = profile_step_range(config_.train.profile_steps);
  if (steps && (steps->first < schedule_->first_step() || steps->last > schedule_->last_step())) {
    spdlog::warn(
        "train.profile_steps {} is not within the steps this run trains ({} to {}): "
        "nothing is traced",
        config_.train.profile_steps, schedule_->first_step(), schedule_->last_step());
  }
  profiler_ = std::make_unique<StepProfiler>(steps, run_dir_ / "profile", device_.is_cuda());
}

// Every rank must train the same model on the same config: the configs are compared by hash,
// before the first collective that the config shapes (the model's units under ZeRO-3).
void TrainingRun::agree_on_config() {
  if (world_.size == 1) return;
  const std::string yaml = config_to_yaml(config_);
  const at::Tensor config_bytes =
      at::from_blob(const_cast<char*>(yaml.data()), {static_cast<int64_t>(yaml.size())}, at::kByte);
  if (!same_on_all_ranks({config_bytes}, *communicator_)) {
    throw UserError(
        "the ranks were given different configs: start every rank with the same file and --set");
  }
}

// Needs the model's final weights: rank 0's on every rank. Under ZeRO-3 each unit was broadcast
// as it was made (UnitShards::fill), within each group of dist.shard_ranks; the groups, replicas
// of each other, are then compared part by part.
void TrainingRun::agree_on_weights() {
  if (world_.size == 1) return;
  if (weights_without_bytes()) {
    if (shard_groups_ &&
        !same_across_replicas(optimizer_->weight_parts(), *shard_groups_, *communicator_)) {
      throw std::runtime_error(
          "the groups of dist.shard_ranks hold different weights after the set-up: their first "
          "ranks read different files, or drew other values");
    }
    spdlog::info("{} ranks agree on the config; each unit of rank 0's {} weights broadcast",
                 world_.size, model_->num_parameters());
    return;
  }
  at::NoGradGuard no_grad;
  for (const at::Tensor& parameter : parameters_) communicator_->broadcast(parameter, 0);
  if (!same_on_all_ranks(parameters_, *communicator_)) {
    throw std::runtime_error("the ranks' weights differ after rank 0's were broadcast");
  }
  spdlog::info("{} ranks agree on the config; rank 0's {} weights broadcast", world_.size,
               model_->num_parameters());
}

void TrainingRun::announce() {
  const int64_t max_steps = schedule_->max_steps();
  spdlog::info("model: {} parameters, {:.1f} MFLOP per token | {} rank(s), rank 0 on {}",
               model_->num_parameters(), flops_per_token_ / 1e6, world_.size,
               describe_device(device_));
  if (world_.launcher != Launcher::none) {
    spdlog::info("launcher: {}{}", launcher_name(world_.launcher),
                 world_.uses_mpi ? ""
                                 : fmt::format("; the ranks met at {}",
                                               config_.dist.rendezvous == "tcp"
                                                   ? fmt::format("{}:{}", world_.rendezvous_host,
                                                                 world_.rendezvous_port)
                                                   : config_.dist.rendezvous));
  }
  log_precision(precision_);
  if (device_.is_cuda() && !precision_.bf16) {
    spdlog::info("fp32 matrix products: {} (train.tf32)",
                 cuda_matmuls_in_tf32() ? "TF32 (on Ampere and newer)" : "full fp32");
  }
  if (config_.lora.enabled()) {
    spdlog::info(
        "LoRA: adapters of rank {} (alpha {:g}) on {}: {} parameters train, the model's {} are "
        "frozen",
        config_.lora.rank, config_.lora.alpha, fmt::join(config_.lora.target_list(), ", "),
        config_.lora.parameters(config_.model), config_.model.parameters());
  }
  spdlog::info("kernels: {} (train.kernels: {})", describe(model_->kernels()),
               config_.train.kernels);
  spdlog::info("optimizer: {}, {:.1f} MB of state on this rank{}",
               config_.optim.name == "muon"
                   ? fmt::format("Muon (lr {:g}) for the blocks' matrices, AdamW (lr {:g}) for the "
                                 "embedding and the norms",
                                 config_.optim.lr * muon_lr_ratio(config_.optim), config_.optim.lr)
                   : "AdamW",
               static_cast<double>(optimizer_->state_bytes()) / 1e6,
               shards_optimizer(config_, world_.size)
                   ? fmt::format(" (dist.zero_stage {}: its part of {} ranks')",
                                 config_.dist.zero_stage, shard_group_size(config_, world_.size))
                   : "");
  announce_sources();
  if (document_start_) announce_document_masking();
  if (leader_) announce_loss_masks();
  // Open MPI's mpirun answers Ctrl-C by killing the ranks a second after it warns them, too soon to
  // checkpoint; SIGUSR1 it forwards. launch/local_ranks.sh turns Ctrl-C into that.
  if (launched_by_mpirun()) {
    spdlog::info(
        "to stop with a checkpoint, send SIGUSR1 to mpirun (kill -USR1 {}): it forwards it to "
        "every rank, where Ctrl-C on mpirun kills them before they can save "
        "(launch/local_ranks.sh turns Ctrl-C into SIGUSR1)",
        ::getppid());
  }
  if (leader_) {
    metrics_->write({{"event", "start"},
                     {"step", progress_.step},
                     {"max_steps", max_steps},
                     {"parameters", model_->num_parameters()},
                     {"tokens_per_step", tokens_per_step_},
                     {"world_size", world_.size},
                     {"optimizer_state_bytes", optimizer_->state_bytes()},
                     {"setup_peak_memory_bytes", peak_memory()},
                     {"device", describe_device(device_)}});
  }
}

// The training data: each source's tokens, windows, share and the epochs of it that the run will
// have read by its last step, with a warning for each that it repeats.
void TrainingRun::announce_sources() {
  const int64_t max_steps = schedule_->max_steps();
  const auto samples_at_end =
      static_cast<double>(max_steps) * static_cast<double>(layout_.global_batch());
  int64_t windows = 0;
  for (const RunSource& source : sources_) windows += source.train->num_windows();
  spdlog::info(
      "{} steps of {} tokens ({} ranks x {} windows x {} micro-steps); {:.2f} epochs of the "
      "training data",
      max_steps, tokens_per_step_, world_.size, layout_.micro_batch, layout_.grad_accum,
      samples_at_end / static_cast<double>(windows));
  if (sources_.size() == 1 && sources_.front().name.empty()) return;
  const std::vector<double> shares = shares_of(sources_);
  const std::vector<int64_t> consumed = blend_->consumed(progress_.samples_consumed);
  for (size_t s = 0; s < sources_.size(); ++s) {
    const RunSource& source = sources_[s];
    const double samples =
        static_cast<double>(consumed[s]) +
        shares[s] * (samples_at_end - static_cast<double>(progress_.samples_consumed));
    const double epochs = samples / static_cast<double>(source.train->num_windows());
    spdlog::info(
        "source {}: {} tokens, {} windows, weight {:g} ({:.1f}% of the samples), {:.2f} "
        "epochs of it by step {}",
        source.name, source.train->num_tokens(), source.train->num_windows(), source.weight,
        100 * shares[s], epochs, max_steps);
    if (epochs > 1.0) {
      spdlog::warn("source {} will be repeated: {:.2f} epochs of it, each in a new order",
                   source.name, epochs);
    }
  }
}

// Where documents begin, and a warning for each source whose first windows hold no such token:
// its windows would each be read as one document, as without masking, which a wrong
// data.eot_token would also give.
void TrainingRun::announce_document_masking() {
  spdlog::info(
      "attention within documents: each begins at token {} ({}), its positions counted from 0",
      *document_start_,
      config_.data.eot_token >= 0 ? "data.eot_token" : "the tokenizer's end-of-document token");
  constexpr int64_t kWindowsLookedAt = 16;
  for (const RunSource& source : sources_) {
    const int64_t count = std::min(kWindowsLookedAt, source.train->num_windows());
    std::vector<int64_t> indices(static_cast<size_t>(count));
    std::iota(indices.begin(), indices.end(), 0);
    const at::Tensor first = gather_windows(*source.train, indices);
    if (!(first == *document_start_).any().item<bool>()) {
      spdlog::warn(
          "{}the first {} training windows hold no token {}: each would be read as one "
          "document; is it the token that ends the documents of these shards (data.eot_token)?",
          source.name.empty() ? "" : fmt::format("source {}: ", source.name), count,
          *document_start_);
    }
  }
}

// With loss masks (a chat corpus), what the loss is the mean of, and how many conversations are
// longer than a window. (Windows lie at a fixed stride over the packed documents, so a shorter one
// may be cut too, where it crosses a window's end.) A pass over the masked shards: the leader's.
void TrainingRun::announce_loss_masks() {
  const std::optional<int64_t> end_of_document = end_of_document_token(config_);
  for (const RunSource& source : sources_) {
    if (!source.train->has_loss_masks()) continue;
    const TokenWindows::LossMaskSummary summary =
        source.train->loss_mask_summary(end_of_document.value_or(-1));
    const std::string name = source.name.empty() ? "" : fmt::format("source {}: ", source.name);
    spdlog::info(
        "{}loss masks: the loss is the mean over the targets that count (the answers), {} of the "
        "{} training tokens ({:.1f}%){}",
        name, summary.targets, summary.tokens,
        100.0 * static_cast<double>(summary.targets) / static_cast<double>(summary.tokens),
        end_of_document
            ? fmt::format("; {} of {} documents (conversations, or under the llama2 template "
                          "their exchanges) are longer than a window of data.seq_len + 1 = {} "
                          "tokens, so that no window holds them whole",
                          summary.documents_cut, summary.documents, config_.data.seq_len + 1)
            : "");
  }
}

// A blend's counts for the checkpoint: each source's samples, where its weights began, and the
// sources of earlier runs that this one does not list, as they were.
void TrainingRun::record_blend() {
  progress_.sources.clear();
  progress_.blend_start = 0;
  const BlendSegment& segment = blend_start_.segment;
  // One corpus read in its order from sample 0 records nothing, as before blends.
  if (sources_.size() == 1 && sources_.front().name.empty() && segment.start == 0 &&
      blend_start_.unlisted.empty())
    return;
  const std::vector<int64_t> consumed = blend_->consumed(progress_.samples_consumed);
  for (size_t s = 0; s < sources_.size(); ++s) {
    progress_.sources.push_back({.name = sources_[s].name,
                                 .weight = sources_[s].weight,
                                 .consumed = consumed[s],
                                 .consumed_at_start = segment.consumed[s]});
  }
  for (const SourceProgress& unlisted : blend_start_.unlisted)
    progress_.sources.push_back(unlisted);
  progress_.blend_start = segment.start;
}

void TrainingRun::run() {
  if (!schedule_->keep_going(progress_.step)) {
    spdlog::info(
        "nothing to train: the run is at step {} and ends at step {} ({}); raise it to "
        "train on",
        progress_.step, schedule_->last_step(),
        schedule_->stops_early() ? "train.stop_at" : "train.max_steps");
    return;
  }
  announce();
  install_stop_handlers();
  // The peak memory logged is the training's; the set-up's is in the start record.
  if (cpu_allocations_) {
    cpu_allocations_->reset_peak();
  } else {
    reset_peak_memory(device_);
  }
  start_ = Clock::now();
  while (schedule_->keep_going(progress_.step)) {
    const int64_t step = progress_.step + 1;
    if (unread_.empty()) unread_since_ = Clock::now();
    if (profiler_) profiler_->before_step(step);
    communicator_->flight().set_step(step);
    unread_.push_back(train_step(*step_parts_, step));
    if (profiler_) profiler_->after_step(step);
    record_step(unread_.back());
    if (run_dir_lock_) run_dir_lock_->keep_held();
    note_write_failure();
    const bool stopping = any_rank_asked_to_stop();
    if (schedule_->log_now(step) || schedule_->checkpoint_now(step) || checkpoint_postponed_ ||
        stopping) {
      const StepResult result = unread_.back();
      const std::optional<StepValues> values = read_steps();
      // After a rollback the step is undone: a stop asked for meanwhile is still asked for, and
      // stops the run after the next step, with its checkpoint.
      if (!values) continue;
      if (schedule_->log_now(step)) log_step(result, *values);
    }
    if (schedule_->evaluate_now(step)) evaluate_now(step);
    if (stopping) {
      const std::string signal =
          stop_requested() != 0 ? strsignal(stop_requested()) : "a signal to another rank";
      if (bad_steps_in_a_row_ > 0) {
        settle_stop_vote();
        settle_checkpoint_writes();
        const std::optional<std::string> good = name_last_good();
        spdlog::warn(
            "stopped by {} after step {}, with its last {} steps skipped: not saved (its weights "
            "may hold the update that made them fail); {}",
            signal, step, bad_steps_in_a_row_,
            good ? "the last good checkpoint is " + *good : "no good checkpoint was saved");
        return;
      }
      std::optional<std::filesystem::path> path = save_checkpoint();
      settle_stop_vote();
      if (const auto written = settle_checkpoint_writes()) path = written;
      spdlog::info("stopped by {} after step {}; continue with --resume auto (or --resume {})",
                   signal, step, path.value_or("").string());
      return;
    }
    if (schedule_->checkpoint_now(step) || checkpoint_postponed_) checkpoint_when_due(step);
  }
  settle_stop_vote();
  settle_checkpoint_writes();
  if (schedule_->stops_early()) {
    spdlog::info("stopped at train.stop_at = {}; continue with --resume auto",
                 schedule_->last_step());
    return;
  }
  spdlog::info("trained {} steps in {}", schedule_->max_steps() - schedule_->first_step() + 1,
               duration_text(seconds_since(start_)));
  if (!leader_) return;
  // A picture is a convenience: it never fails a run that trained.
  try {
    draw_loss_curve(run_dir_);
  } catch (const std::exception& error) {
    spdlog::warn("no loss curve: {}", error.what());
  }
}

void TrainingRun::record_step(const StepResult& result) {
  progress_.step = result.step;
  progress_.samples_consumed += layout_.global_batch();
  progress_.tokens_seen += tokens_per_step_;
  progress_.learning_rate = result.lr;
}

// Reads the losses and gradient norms of the steps not read yet, in one copy from the device, and
// counts the skipped ones. Returns the last step's, or nothing where the skipped steps made the
// run roll back.
std::optional<StepValues> TrainingRun::read_steps() {
  std::vector<at::Tensor> device_values;
  for (const StepResult& result : unread_) {
    device_values.push_back(result.loss);
    device_values.push_back(result.grad_norm.to(at::kDouble));
    device_values.push_back(result.skipped.to(at::kDouble));
    device_values.push_back(result.loss_level);
  }
  const at::Tensor values = read_to_host(at::stack(device_values));
  const double seconds = seconds_since(unread_since_);
  const double* value = values.data_ptr<double>();
  const std::vector<StepResult> steps = std::exchange(unread_, {});
  if (steps.front().step > schedule_->first_step()) {
    timed_seconds_ += seconds;
    timed_steps_ += static_cast<int64_t>(steps.size());
  }
  StepValues last{};
  for (size_t i = 0; i < steps.size(); ++i) {
    const double* step_values = value + kValuesPerStep * i;
    last = {.loss = step_values[0],
            .grad_norm = step_values[1],
            .seconds_per_step = seconds / static_cast<double>(steps.size()),
            .skipped = step_values[2] != 0.0,
            .loss_level = step_values[3]};
    if (last.skipped) {
      if (count_skipped_step(steps[i].step, last)) return std::nullopt;
    } else {
      bad_steps_in_a_row_ = 0;
      lineage_->applied(steps[i].step);
    }
  }
  return last;
}

// A skipped step: its loss or gradient went non-finite, or its loss spiked. After
// train.max_bad_steps in a row the run rolls back (roll_back()), and true is returned.
bool TrainingRun::count_skipped_step(int64_t step, const StepValues& values) {
  ++bad_steps_in_a_row_;
  const bool spike = std::isfinite(values.loss) && std::isfinite(values.grad_norm);
  const std::string what =
      spike ? fmt::format(
                  "loss {:.4f} is {:.1f} times its running level {:.4f} (train.spike_guard "
                  "= {:g})",
                  values.loss, values.loss / values.loss_level, values.loss_level,
                  config_.train.spike_guard)
            : fmt::format("non-finite loss {} or gradient norm {}", values.loss, values.grad_norm);
  spdlog::warn("step {}: {}: update skipped ({} in a row, train.max_bad_steps = {})", step, what,
               bad_steps_in_a_row_, config_.train.max_bad_steps);
  if (leader_)
    metrics_->write({{"step", step},
                     {"skipped", spike ? "loss spike" : "non-finite"},
                     {"loss", values.loss},
                     {"grad_norm", values.grad_norm},
                     {"loss_level", values.loss_level}});
  if (bad_steps_in_a_row_ < config_.train.max_bad_steps) return false;
  roll_back(step,
            fmt::format("{} {} steps in a row{}", bad_steps_in_a_row_,
                        spike ? "skipped" : "non-finite", spike ? " (the last a loss spike)" : ""));
  return true;
}

// After train.max_bad_steps skipped steps in a row (`bad_steps` says which), as of step `step`:
// the weights, the moments and the spike guard's level go back to a good checkpoint, and the run
// trains on from its step with the samples after those read so far, so that the samples behind
// the bad steps are not read again (as Megatron and PaLM recover). The samples and tokens read,
// and the best validation loss, stay as they are: they count what the run did. Every rank does
// this together (all read the same averaged losses). The checkpoints that hold the weights the
// skipped steps came from are set aside as bad, and a rollback that comes back to the same
// trouble goes further back (checkpoint_lineage.h); with nothing left to go back to, the run
// stops. A failure to write or to load a checkpoint ends the run on every rank.
void TrainingRun::roll_back(int64_t step, const std::string& bad_steps) {
  // Every rank's last write ends first; a failure ends every rank. Also the barrier after which
  // the checkpoints are there for every rank to read.
  settle_checkpoint_writes();
  const CheckpointLineage::Rollback rollback = lineage_->roll_back(checkpoints_at_hand());
  set_aside_bad(rollback.bad,
                rollback.target ? rollback.target : lineage_->newest_good(checkpoints_at_hand()));
  if (!rollback.target) stop_with_no_checkpoint_left(step, bad_steps);
  const std::filesystem::path checkpoint = checkpoint_of(*rollback.target);
  step_parts_.reset();  // they refer to the loader
  loader_.reset();
  std::optional<TrainingProgress> restored;
  std::string load_failure;
  try {
    restored = checkpoints_.resume(checkpoint.string(), model_, *optimizer_, config_);
  } catch (const std::exception& error) {
    load_failure = error.what();
  }
  if (communicator_->all_reduce_sum(load_failure.empty() ? 0.0 : 1.0) > 0) {
    throw std::runtime_error(fmt::format(
        "step {}: {}: rolling back to {} failed: {}", step, bad_steps, checkpoint.string(),
        load_failure.empty() ? "another rank could not load it" : load_failure));
  }
  const int64_t samples_left_out = progress_.samples_consumed - restored->samples_consumed;
  progress_.step = restored->step;
  progress_.learning_rate = restored->learning_rate;
  progress_.loss_level = restored->loss_level;
  bad_steps_in_a_row_ = 0;
  checkpoint_postponed_ = false;
  start_data();
  spdlog::warn(
      "step {}: {}: rolled back to {} (step {}); training goes on from there past the {} samples "
      "read since, which are left out",
      step, bad_steps, checkpoint.string(), progress_.step, samples_left_out);
  if (leader_)
    metrics_->write({{"step", step},
                     {"event", "rollback"},
                     {"to_step", progress_.step},
                     {"checkpoint", checkpoint.string()},
                     {"set_aside", rollback.bad},
                     {"samples_left_out", samples_left_out}});
}

// The checkpoints a rollback may go back to, by step: the store's, and the one the run resumed
// from, wherever it is. Rank 0's list, which every rank takes (a collective): ranks that listed
// for themselves could see other lists (a stale network filesystem, a directory they do not
// share) and go back to other checkpoints, their weights apart from then on.
std::vector<int64_t> TrainingRun::checkpoints_at_hand() const {
  std::vector<int64_t> steps;
  if (leader_) {
    steps = checkpoints_.saved_steps();
    std::error_code error;
    if (resumed_step_ && std::filesystem::is_directory(resumed_from_, error))
      steps.push_back(*resumed_step_);
  }
  const auto count =
      static_cast<int64_t>(communicator_->all_reduce_sum(static_cast<double>(steps.size())));
  if (count == 0) return {};
  at::Tensor shared = leader_ ? at::tensor(steps, at::kLong) : at::zeros({count}, at::kLong);
  shared = shared.to(device_);
  communicator_->broadcast(shared, 0);
  shared = shared.to(at::kCPU);
  return {shared.data_ptr<int64_t>(), shared.data_ptr<int64_t>() + count};
}

std::filesystem::path TrainingRun::checkpoint_of(int64_t step) const {
  std::error_code error;
  if (step == resumed_step_ && !std::filesystem::is_directory(checkpoints_.path_of(step), error))
    return resumed_from_;
  return checkpoints_.path_of(step);
}

// Rank 0 moves the checkpoints found bad out of the way of every later resume and rollback
// (the one the run resumed from outside its directory is left where it is); `latest`, where it
// named one of them, names `instead`. A failure ends every rank.
void TrainingRun::set_aside_bad(const std::vector<int64_t>& bad, std::optional<int64_t> instead) {
  std::string failure;
  if (leader_) {
    try {
      for (const int64_t step : bad) {
        std::error_code error;
        if (!std::filesystem::is_directory(checkpoints_.path_of(step), error)) continue;
        const std::filesystem::path aside = checkpoints_.set_aside(step, instead);
        spdlog::warn(
            "{} set aside as {}: the steps trained from its weights were skipped (nothing "
            "resumes from it there)",
            checkpoints_.path_of(step).string(), aside.filename().string());
      }
    } catch (const std::exception& error) {
      failure = error.what();
    }
  }
  if (communicator_->all_reduce_sum(failure.empty() ? 0.0 : 1.0) > 0) {
    throw std::runtime_error(leader_
                                 ? fmt::format("setting aside a bad checkpoint failed: {}", failure)
                                 : "rank 0 could not set aside a bad checkpoint");
  }
}

// No checkpoint is left to go back to: none was saved before the skipped steps, or the run went
// back to each and the trouble came back. Then the settings are at fault, not a few samples: the
// run stops, and `latest` names its last good checkpoint, where --resume auto goes on once they
// are fixed.
void TrainingRun::stop_with_no_checkpoint_left(int64_t step, const std::string& bad_steps) {
  const std::optional<std::string> good = name_last_good();
  // Rank 0 has pointed `latest` at it before any rank's error can end the others.
  communicator_->all_reduce_sum(0.0);
  std::vector<std::string> tried;
  for (const int64_t target : lineage_->tried()) tried.push_back(checkpoint_name(target));
  const std::string again =
      tried.empty() ? "" : fmt::format(" again after rolling back to {}", fmt::join(tried, ", "));
  if (!good) {
    throw std::runtime_error(fmt::format(
        "step {}: {}{}: stopping; there is no good checkpoint to go back to: {}", step, bad_steps,
        again,
        tried.empty() ? "none was saved before the steps that were skipped"
                      : "no step trained from any checkpoint gone back to was applied (those "
                        "were set aside as step_XXXXXXXX.bad-N)"));
  }
  throw std::runtime_error(fmt::format(
      "step {}: {}{}: stopping, with no checkpoint left to go back to; the settings are at fault, "
      "not a few samples; the last good checkpoint is {} once they are fixed",
      step, bad_steps, again, *good));
}

// The run's last good checkpoint, and how to go on from it: rank 0 makes `latest` name it where it
// is in the run's directory, so that --resume auto goes on from it. Nothing where the run has
// none.
std::optional<std::string> TrainingRun::name_last_good() {
  const std::optional<int64_t> good = lineage_->newest_good(checkpoints_at_hand());
  if (!good) return std::nullopt;
  const std::filesystem::path path = checkpoint_of(*good);
  if (path != checkpoints_.path_of(*good))
    return fmt::format("{}: continue from it with --resume {}", path.string(), path.string());
  if (leader_) {
    try {
      checkpoints_.point_latest_at(*good);
    } catch (const std::exception& failure) {
      spdlog::warn("{} could not be made to name it: {}",
                   (run_dir_ / "checkpoints" / "latest").string(), failure.what());
    }
  }
  return fmt::format("{}: continue from it with --resume auto", path.string());
}

// A checkpoint due at `step`, or postponed to it, is saved once steps are applied again: while
// they are skipped, the weights may hold the update that made them fail. The run's last step has
// no later step to wait for: skipped steps there roll the run back, as max_bad_steps would.
void TrainingRun::checkpoint_when_due(int64_t step) {
  if (bad_steps_in_a_row_ == 0) {
    checkpoint_postponed_ = false;
    save_checkpoint();
    return;
  }
  if (step == schedule_->last_step()) {
    roll_back(step,
              fmt::format("{} skipped steps in a row at the run's last step", bad_steps_in_a_row_));
    return;
  }
  if (!checkpoint_postponed_) {
    spdlog::warn(
        "step {}: the checkpoint waits for the next step that is applied ({} skipped in "
        "a row)",
        step, bad_steps_in_a_row_);
  }
  checkpoint_postponed_ = true;
}

void TrainingRun::log_step(const StepResult& result, const StepValues& values) {
  const int64_t step = result.step;
  const double tokens_per_s = tokens_per_step_ / values.seconds_per_step;
  const double flops = flops_per_token_ * tokens_per_s;
  const double peak_flops = peak_bf16_flops(device_) * world_.size;
  const double mean_step = timed_steps_ > 0 ? timed_seconds_ / static_cast<double>(timed_steps_)
                                            : values.seconds_per_step;
  const auto steps_left = static_cast<double>(schedule_->last_step() - step);
  const std::string speed = peak_flops > 0 ? fmt::format("MFU {:.1f}%", 100 * flops / peak_flops)
                                           : fmt::format("{:.1f} GFLOP/s", flops / 1e9);
  spdlog::info(
      "step {}/{} | loss {:.4f}{} | lr {:.2e} | grad norm {:.3f} | {:.0f} ms/step (data {:.1f} ms) "
      "| {:.0f} tok/s | {} | mem {:.2f} GB | ETA {}",
      step, schedule_->max_steps(), values.loss,
      result.targets > 0 ? fmt::format(" over {} targets", result.targets) : "", result.lr,
      values.grad_norm, values.seconds_per_step * 1e3, result.data_ms, tokens_per_s, speed,
      peak_memory() / 1e9, duration_text(mean_step * steps_left));
  if (leader_) {
    nlohmann::json record = {{"step", step},
                             {"loss", values.loss},
                             {"lr", result.lr},
                             {"grad_norm", values.grad_norm},
                             {"step_ms", values.seconds_per_step * 1e3},
                             {"data_ms", result.data_ms},
                             {"tokens_per_s", tokens_per_s},
                             {"flops_per_s", flops},
                             {"peak_memory_bytes", peak_memory()},
                             {"elapsed_s", seconds_since(start_)}};
    if (result.targets > 0) record["targets"] = result.targets;
    if (device_.is_cpu()) {
      record["forward_backward_ms"] = result.forward_backward_ms;
      record["optimizer_ms"] = result.optimizer_ms;
    }
    metrics_->write(record);
    if (tensorboard_) {
      tensorboard_->write(
          step,
          {{"train/loss", values.loss},
           {"train/lr", result.lr},
           {"train/grad_norm", values.grad_norm},
           {"train/tokens_per_s", tokens_per_s},
           peak_flops > 0 ? std::pair{std::string("train/mfu_percent"), 100 * flops / peak_flops}
                          : std::pair{std::string("train/gflops_per_s"), flops / 1e9},
           {"train/peak_memory_gb", peak_memory() / 1e9}});
    }
  }
}

void TrainingRun::evaluate_now(int64_t step) {
  // Under ZeRO-3 unit by unit, as training runs the model (evaluation.h).
  const SourcesEvaluation evaluated =
      evaluate_sources(model_, sources_, layout_, config_.train.eval_batches, device_,
                       precision_.bf16, *communicator_, document_start_);
  const Evaluation& evaluation = evaluated.mean;
  progress_.best_val_loss = std::min(progress_.best_val_loss, evaluation.loss);
  spdlog::info("step {} | val loss {:.4f} | val ppl {:.2f} | {} tokens{}", step, evaluation.loss,
               evaluation.perplexity, evaluation.tokens, evaluated.by_source_text());
  if (leader_) {
    nlohmann::json record = {
        {"step", step}, {"val_loss", evaluation.loss}, {"val_ppl", evaluation.perplexity}};
    record.update(evaluated.by_source_json());
    metrics_->write(record);
    if (tensorboard_) {
      std::vector<std::pair<std::string, double>> scalars = {{"val/loss", evaluation.loss},
                                                             {"val/ppl", evaluation.perplexity}};
      for (const auto& [name, by_source] : evaluated.by_source)
        scalars.emplace_back("val/loss/" + name, by_source.loss);
      tensorboard_->write(step, scalars);
    }
  }
}

// Every rank writes what it alone holds of the checkpoint (the parts of sharded weights and state;
// rank 0 also what every rank holds alike), here or in the background, and no rank gathers the
// model: rank 0 begins it, every rank writes its share, and rank 0 finishes it once all have
// (CheckpointStore::begin). Where not every rank sees the run directory, rank 0 gathers
// everything and writes it alone. First the ranks check that they still hold the same weights, as
// data parallelism promises. Returns the checkpoint once it is written here (rank 0's).
std::optional<std::filesystem::path> TrainingRun::save_checkpoint() {
  const Clock::time_point start = Clock::now();
  // Sharded weights (ZeRO-3) are the same on every rank by construction: hashing them would say
  // nothing, at the cost of gathering them.
  const bool weights_replicated = optimizer_->unit_hooks() == nullptr;
  // Frozen weights (LoRA's) cannot diverge: the trained ones are hashed.
  std::vector<at::Tensor> trained;
  for (const at::Tensor& parameter : parameters_)
    if (parameter.requires_grad()) trained.push_back(parameter);
  if (world_.size > 1 && weights_replicated && !same_on_all_ranks(trained, *communicator_)) {
    throw std::runtime_error(fmt::format(
        "the ranks' weights differ at step {}: data-parallel training diverged", progress_.step));
  }
  progress_.loss_level = spike_guard_->level();
  record_blend();
  // One host copy at a time: the writes before end first (a failure of theirs ends every rank).
  settle_checkpoint_writes();
  // Each move of the save runs only where none failed before it; the ranks meet between moves,
  // and a failure anywhere ends them all, rank 0 removing what was begun.
  std::string failure;
  const auto attempt = [&failure](const std::function<void()>& move) {
    if (!failure.empty()) return;
    try {
      move();
    } catch (const std::exception& error) {
      failure = error.what();
    }
  };
  const auto meet = [&] {
    if (communicator_->all_reduce_sum(failure.empty() ? 0.0 : 1.0) == 0) return;
    if (leader_) checkpoint_writer_.abandon(progress_.step);
    fail_write(failure);
  };
  std::optional<WholeWeights> gathered;
  if (!run_dir_shared_) gathered.emplace(*optimizer_);
  // A collective where the state is gathered (Optimizer::state), so every rank makes its own.
  std::optional<CheckpointContents> contents;
  try {
    contents = checkpoint_contents(
        model_, *optimizer_, {.leader = leader_, .writing = run_dir_shared_ ? world_.size : 1},
        progress_, config_, tokenizer_model_, world_.size, checkpoint_writer_.in_background());
  } catch (const std::exception& error) {
    if (failure.empty()) failure = error.what();
  }
  if (leader_) attempt([&] { checkpoint_writer_.begin(*contents); });
  meet();  // no rank writes before rank 0 has made the files
  attempt([&] { checkpoint_writer_.save(*contents, lineage_->confirmed()); });
  meet();  // here: every share is written
  std::optional<std::filesystem::path> path;
  if (leader_ && !checkpoint_writer_.in_background())
    attempt([&] { path = checkpoint_writer_.finish(*contents, lineage_->confirmed()); });
  meet();  // every rank stays behind rank 0's save: a failed one ends them all
  lineage_->saved(progress_.step);
  // How long training stopped for the checkpoint: bench/checkpoint_pause.sh reads it.
  if (leader_)
    metrics_->write(
        {{"step", progress_.step}, {"checkpoint_pause_ms", 1e3 * seconds_since(start)}});
  return path;
}

// The peak memory since training started: the device's (peak_memory_bytes), or under
// train.cpu_memory allocator the CPU allocator's.
int64_t TrainingRun::peak_memory() const {
  return cpu_allocations_ ? cpu_allocations_->peak_bytes() : peak_memory_bytes(device_);
}

// A stop vote of a rank whose background write failed: above any count of ranks asking to stop.
constexpr double kWriteFailedVote = 1 << 30;

// A signal reaches one rank (Slurm signals them all, a Ctrl-C only the launcher's): the ranks
// agree at step boundaries, so that all of them checkpoint and stop together. Each step's vote is
// collected at the end of the next step, so that no rank waits for the others at every step: a
// signal stops the run one step after it arrives.
bool TrainingRun::any_rank_asked_to_stop() {
  const double votes = stop_vote_ != nullptr ? std::exchange(stop_vote_, nullptr)->wait() : 0.0;
  if (votes >= kWriteFailedVote) fail_write(write_failure_);
  stop_vote_ = communicator_->start_all_reduce_sum(
      (stop_requested() != 0 ? 1.0 : 0.0) + (write_failure_.empty() ? 0.0 : kWriteFailedVote));
  return votes > 0;
}

// This rank's background write that failed since the last step: every rank learns of it through
// the next stop vote, and all end together.
void TrainingRun::note_write_failure() {
  if (!write_failure_.empty()) return;
  try {
    checkpoint_writer_.check();
  } catch (const std::exception& error) {
    write_failure_ = error.what();
  }
}

// Waits for the writes in flight: a failure ends every rank, with the rank that failed naming it.
// Every rank but 0 waits first and the ranks meet, and only then rank 0, which awaits their
// marks: where one of them failed without a mark, the run ends (and with it rank 0's wait)
// rather than keeping rank 0 waiting for it until dist.timeout_s. Returns the checkpoint written,
// on rank 0.
std::optional<std::filesystem::path> TrainingRun::settle_checkpoint_writes() {
  std::optional<std::filesystem::path> written;
  std::string failure = write_failure_;
  for (const bool waits_here : {!leader_, leader_}) {
    if (waits_here && failure.empty()) {
      try {
        written = checkpoint_writer_.wait();
      } catch (const std::exception& error) {
        failure = error.what();
      }
    }
    if (communicator_->all_reduce_sum(failure.empty() ? 0.0 : 1.0) > 0) fail_write(failure);
  }
  return written;
}

// Ends this rank after a failed save: with the reason where it failed here, else pointing to the
// rank that did (rank 0 also names a rank that failed to write its share in the background).
void TrainingRun::fail_write(const std::string& failure) const {
  throw std::runtime_error(!failure.empty()
                               ? failure
                               : "another rank could not write a checkpoint (its log says why); "
                                 "the checkpoints before it are kept");
}

// Every rank takes part in the last vote before the run ends.
void TrainingRun::settle_stop_vote() {
  if (stop_vote_ != nullptr) std::exchange(stop_vote_, nullptr)->wait();
}

}  // namespace

void train(const Config& config, const std::string& resume, const World& world,
           const TrainingHooks& hooks) {
  apply_compute_settings(config.train);
  TrainingRun(config, resume, world, hooks).run();
}

}  // namespace mltrain
