#include "trainer/training_run.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "dist/grad_reducer.h"
#include "model/hf_state_dict.h"
#include "trainer/adamw.h"
#include "trainer/checkpoint.h"
#include "trainer/device.h"
#include "trainer/fault_injection.h"
#include "trainer/loss_plot.h"
#include "trainer/lr_schedule.h"
#include "trainer/metrics_log.h"
#include "trainer/precision.h"
#include "trainer/stop_signal.h"
#include "trainer/train_step.h"

namespace mltrain {
namespace {

using Clock = std::chrono::steady_clock;

// The first bucket is small so that the first all-reduce starts early in backward.
constexpr double kFirstBucketMb = 1.0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string duration_text(double seconds) {
  const auto total = static_cast<int64_t>(std::lround(seconds));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, total % 3600 / 60);
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

// The device of this rank: cuda:local_rank when training on GPUs.
c10::Device rank_device(const Config& config, const World& world) {
  const c10::Device device = resolve_device(config.train.device);
  if (!device.is_cuda()) return device;
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  if (world.local_rank >= visible) {
    throw UserError(fmt::format("{} ranks on this node but only {} visible GPUs: start one rank per GPU",
                                world.local_size, visible));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
}

// The communicator for dist.backend. A backend that cannot carry this run's tensors is an error,
// not a silent fallback.
std::unique_ptr<Communicator> run_communicator(const Config& config, const World& world, const c10::Device& device) {
  if (world.size > 1 && config.dist.backend == "nccl" && !device.is_cuda()) {
    throw UserError("dist.backend nccl needs CUDA training (train.device); use mpi or auto on the CPU");
  }
  if (world.size > 1 && config.dist.backend == "mpi" && device.is_cuda()) {
    throw UserError("dist.backend mpi all-reduces CPU tensors; CUDA training uses nccl (or auto)");
  }
  return make_communicator(world, device.is_cuda(), static_cast<double>(config.dist.timeout_s));
}

void check_tokenizer(const Config& config) {
  if (config.data.tokenizer.empty()) return;
  const Tokenizer tokenizer(config.data.tokenizer);
  if (tokenizer.vocab_size() > config.model.vocab_size) {
    throw UserError(fmt::format("{}: the tokenizer has {} tokens, more than model.vocab_size = {}",
                                config.data.tokenizer, tokenizer.vocab_size(), config.model.vocab_size));
  }
}

TokenWindows open_windows(const std::string& pattern, const Config& config, const char* split) {
  const auto start = Clock::now();
  TokenWindows windows(pattern, config.data.seq_len, config.model.vocab_size);
  spdlog::info("{} data: {} shards, {} tokens, {} windows of {} (validated in {:.1f} s)", split,
               windows.shards().size(), windows.num_tokens(), windows.num_windows(),
               windows.window_length(), seconds_since(start));
  return windows;
}

// The checkpoint `resume` names: "auto" is the newest in the run directory (none: start fresh),
// anything else a checkpoint directory. A fresh start is refused where checkpoints already are: its own would be pruned against them
// and could replace them.
std::optional<std::filesystem::path> checkpoint_to_resume(const std::string& resume, const CheckpointStore& store) {
  if (resume.empty()) {
    if (const auto existing = store.latest()) {
      throw UserError(fmt::format("{} already holds checkpoints (newest: {}): continue that run with "
                                  "--resume auto, or start a new one in another train.run_dir",
                                  store.directory().parent_path().string(), existing->filename().string()));
    }
    return std::nullopt;
  }
  if (resume == "auto") {
    const auto latest = store.latest();
    if (!latest) spdlog::info("--resume auto: no checkpoint in the run directory yet; starting fresh");
    return latest;
  }
  if (!std::filesystem::is_directory(resume)) {
    throw UserError(fmt::format("--resume {}: no such checkpoint directory", resume));
  }
  return resume;
}

// One training run, from set-up to the last step.
class TrainingRun {
 public:
  TrainingRun(const Config& config, const std::string& resume, const World& world);
  void run();

 private:
  void agree_across_ranks();
  double accumulate_step_gradients();
  void log_step(int64_t step, double loss, double lr, double grad_norm, double step_seconds, double data_ms);
  void evaluate_now(int64_t step);
  std::filesystem::path save_checkpoint();
  bool any_rank_asked_to_stop();

  const Config& config_;
  const World& world_;
  const bool leader_;  // rank 0 writes the run directory
  const c10::Device device_;
  const bool bf16_;
  const BatchLayout layout_;
  std::unique_ptr<Communicator> communicator_;
  TokenWindows train_windows_;
  TokenWindows val_windows_;
  std::filesystem::path run_dir_;
  CheckpointStore checkpoints_;
  Llama model_{nullptr};
  std::vector<at::Tensor> parameters_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<MetricsLog> metrics_;
  TrainingProgress progress_;
  int64_t tokens_per_step_;
  double flops_per_token_;
  Clock::time_point start_;
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;       // train.stop_at or train.max_steps
  double timed_seconds_ = 0.0;  // step time after the first step, which includes warm-up
};

TrainingRun::TrainingRun(const Config& config, const std::string& resume, const World& world)
    : config_(config),
      world_(world),
      leader_(world.rank == 0),
      device_(rank_device(config, world)),
      bf16_(use_bf16_autocast(config.train.precision, device_)),
      layout_{config.data.micro_batch, config.data.grad_accum, world.size},
      communicator_(run_communicator(config, world, device_)),
      train_windows_(open_windows(config.data.train, config, "train")),
      val_windows_(open_windows(config.data.val, config, "val")),
      run_dir_(config.train.run_dir),
      checkpoints_(run_dir_),
      tokens_per_step_(layout_.global_batch() * config.data.seq_len) {
  check_tokenizer(config);
  if (leader_) {
    std::filesystem::create_directories(run_dir_);
    checkpoints_.remove_stale_temporaries();
  }
  at::manual_seed(config.data.seed);
  model_ = Llama(config.model);
  model_->to(device_);
  parameters_ = model_->parameters();
  flops_per_token_ = training_flops_per_token(config.model, model_->num_parameters(), config.data.seq_len);
  optimizer_ = std::make_unique<AdamW>(
      hf_named_parameters(model_),
      AdamWOptions{config.optim.beta1, config.optim.beta2, config.optim.eps, config.optim.weight_decay},
      AdamWKernel::kFused);
  if (const auto checkpoint = checkpoint_to_resume(resume, checkpoints_)) {
    progress_ = load_checkpoint(*checkpoint, model_, *optimizer_, config);
  }
  agree_across_ranks();
  reducer_ = std::make_unique<GradReducer>(parameters_, *communicator_, config.dist.bucket_mb, kFirstBucketMb,
                                           config.dist.overlap, config.dist.grad_dtype == "bf16" && world.size > 1);
  loader_ = std::make_unique<Loader>(train_windows_,
                                     Sampler(train_windows_.num_windows(), config.data.seed, layout_),
                                     world.rank, progress_.samples_consumed, config.data.prefetch, device_.is_cuda());
  if (leader_) {
    write_file_atomically(run_dir_ / "config.yaml", config_to_yaml(config));
    metrics_ = std::make_unique<MetricsLog>(run_dir_ / "metrics.jsonl");
  }
}

// Every rank must train the same model on the same config: rank 0's weights are broadcast, and
// the configs are compared by hash.
void TrainingRun::agree_across_ranks() {
  if (world_.size == 1) return;
  const std::string yaml = config_to_yaml(config_);
  const at::Tensor config_bytes = at::from_blob(const_cast<char*>(yaml.data()), {static_cast<int64_t>(yaml.size())}, at::kByte);
  if (!same_on_all_ranks({config_bytes}, *communicator_)) {
    throw UserError("the ranks were given different configs: start every rank with the same file and --set");
  }
  at::NoGradGuard no_grad;
  for (const at::Tensor& parameter : parameters_) communicator_->broadcast(parameter, 0);
  if (!same_on_all_ranks(parameters_, *communicator_)) {
    throw std::runtime_error("the ranks' weights differ after rank 0's were broadcast");
  }
  spdlog::info("{} ranks agree on the config; rank 0's {} weights broadcast", world_.size, model_->num_parameters());
}

void TrainingRun::run() {
  const int64_t max_steps = config_.train.max_steps;
  const int64_t last_step = config_.train.stop_at > 0 ? std::min(config_.train.stop_at, max_steps) : max_steps;
  first_step_ = progress_.step;
  last_step_ = last_step;
  spdlog::info("model: {} parameters, {:.1f} MFLOP per token | {} rank(s), rank 0 on {} | precision: {}",
               model_->num_parameters(), flops_per_token_ / 1e6, world_.size, describe_device(device_),
               bf16_ ? "bf16 autocast, fp32 weights" : "fp32");
  spdlog::info("{} steps of {} tokens ({} ranks x {} windows x {} micro-steps); {:.2f} epochs of the training data",
               max_steps, tokens_per_step_, world_.size, layout_.micro_batch, layout_.grad_accum,
               static_cast<double>(max_steps * layout_.global_batch()) / train_windows_.num_windows());
  if (leader_) {
    metrics_->write({{"event", "start"}, {"step", progress_.step}, {"max_steps", max_steps},
                     {"parameters", model_->num_parameters()}, {"tokens_per_step", tokens_per_step_},
                     {"world_size", world_.size}, {"device", describe_device(device_)}});
  }
  install_stop_handlers();
  start_ = Clock::now();
  int64_t bad_steps_in_a_row = 0;
  for (int64_t step = first_step_; step < last_step; ++step) {
    const auto step_start = Clock::now();
    const double waited_before = loader_->waited_seconds();
    const double loss = accumulate_step_gradients();
    if (nonfinite_gradients_injected(step)) parameters_.front().grad().fill_(NAN);
    if (world_.rank == 1 && step == 2 && fault_injected("kill-rank-1")) std::raise(SIGKILL);
    if (world_.rank == 1 && step == 2 && fault_injected("hang-rank-1")) std::this_thread::sleep_for(std::chrono::hours(1));
    const double grad_norm = clip_grad_norm(parameters_, config_.optim.grad_clip);
    const double lr = learning_rate(config_.optim, max_steps, step);
    // A non-finite loss or gradient would poison the weights and the moments for good: skip it.
    // Every rank sees the same averaged loss and gradients, so all skip together.
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      ++bad_steps_in_a_row;
      spdlog::warn("step {}: non-finite loss {} or gradient norm {}: update skipped ({} in a row, "
                   "train.max_bad_steps = {})",
                   step + 1, loss, grad_norm, bad_steps_in_a_row, config_.train.max_bad_steps);
      if (leader_) metrics_->write({{"step", step + 1}, {"skipped", true}, {"loss", loss}, {"grad_norm", grad_norm}});
      if (bad_steps_in_a_row >= config_.train.max_bad_steps) {
        const auto latest = checkpoints_.latest();
        throw std::runtime_error(fmt::format("{} non-finite steps in a row: stopping; the last good checkpoint is {}",
                                             bad_steps_in_a_row,
                                             latest ? latest->string() : "none (no checkpoint was saved yet)"));
      }
    } else {
      bad_steps_in_a_row = 0;
      optimizer_->step(lr);
    }
    reducer_->zero_grad();
    progress_.step = step + 1;
    progress_.samples_consumed += layout_.global_batch();
    progress_.tokens_seen += tokens_per_step_;
    progress_.learning_rate = lr;
    const double step_seconds = seconds_since(step_start);
    if (step > first_step_) timed_seconds_ += step_seconds;

    const bool last = step + 1 == max_steps;
    if (step == first_step_ || (step + 1) % config_.train.log_every == 0 || last) {
      log_step(step, loss, lr, grad_norm, step_seconds, (loader_->waited_seconds() - waited_before) * 1e3);
    }
    if ((step + 1) % config_.train.eval_every == 0 || last) evaluate_now(step + 1);
    if (any_rank_asked_to_stop()) {
      const auto path = save_checkpoint();
      spdlog::info("stopped by {} after step {}; continue with --resume auto (or --resume {})",
                   stop_requested() != 0 ? strsignal(stop_requested()) : "a signal to another rank", step + 1,
                   path.string());
      return;
    }
    if ((step + 1) % config_.train.ckpt_every == 0 || step + 1 == last_step) save_checkpoint();
  }
  if (last_step < max_steps) {
    spdlog::info("stopped at train.stop_at = {}; continue with --resume auto", last_step);
    return;
  }
  spdlog::info("trained {} steps in {}", max_steps - first_step_, duration_text(seconds_since(start_)));
  if (leader_) draw_loss_curve(run_dir_);
}

// Forward and backward over the step's micro-batches; only the last one's backward communicates.
// Returns the step's loss averaged over the ranks.
double TrainingRun::accumulate_step_gradients() {
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(device_));
  for (int64_t micro = 0; micro < layout_.grad_accum; ++micro) {
    reducer_->set_sync(micro + 1 == layout_.grad_accum);
    const at::Tensor window = loader_->next().tokens.to(device_, /*non_blocking=*/true);
    loss_sum += forward_backward(model_, window, layout_.grad_accum, device_, bf16_);
  }
  reducer_->finish();
  return communicator_->all_reduce_sum(loss_sum.item<double>()) / world_.size;
}

void TrainingRun::log_step(int64_t step, double loss, double lr, double grad_norm, double step_seconds,
                           double data_ms) {
  const double tokens_per_s = tokens_per_step_ / step_seconds;
  const double flops = flops_per_token_ * tokens_per_s;
  const double peak_flops = peak_bf16_flops(device_) * world_.size;
  const double mean_step = step > first_step_ ? timed_seconds_ / static_cast<double>(step - first_step_) : step_seconds;
  const double steps_left = static_cast<double>(last_step_ - step - 1);
  const std::string speed = peak_flops > 0 ? fmt::format("MFU {:.1f}%", 100 * flops / peak_flops)
                                           : fmt::format("{:.1f} GFLOP/s", flops / 1e9);
  spdlog::info("step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} ms/step (data {:.1f} ms) | "
               "{:.0f} tok/s | {} | mem {:.2f} GB | ETA {}",
               step + 1, config_.train.max_steps, loss, lr, grad_norm, step_seconds * 1e3, data_ms, tokens_per_s,
               speed, peak_memory_bytes(device_) / 1e9, duration_text(mean_step * steps_left));
  if (leader_) {
    metrics_->write({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                     {"step_ms", step_seconds * 1e3}, {"data_ms", data_ms}, {"tokens_per_s", tokens_per_s},
                     {"flops_per_s", flops}, {"elapsed_s", seconds_since(start_)}});
  }
}

void TrainingRun::evaluate_now(int64_t step) {
  const Evaluation evaluation =
      evaluate(model_, val_windows_, layout_, config_.train.eval_batches, device_, bf16_, *communicator_);
  progress_.best_val_loss = std::min(progress_.best_val_loss, evaluation.loss);
  spdlog::info("step {} | val loss {:.4f} | val ppl {:.2f} | {} tokens", step, evaluation.loss,
               evaluation.perplexity, evaluation.tokens);
  if (leader_) {
    metrics_->write({{"step", step}, {"val_loss", evaluation.loss}, {"val_ppl", evaluation.perplexity}});
  }
}

// Rank 0 writes; the others wait for it, so that no rank runs ahead of a checkpoint. First the
// ranks check that they still hold the same weights, as data parallelism promises.
std::filesystem::path TrainingRun::save_checkpoint() {
  if (world_.size > 1 && !same_on_all_ranks(parameters_, *communicator_)) {
    throw std::runtime_error(fmt::format("the ranks' weights differ at step {}: data-parallel training diverged",
                                         progress_.step));
  }
  std::filesystem::path path;  // known to rank 0, the one that reports it
  if (leader_) {
    path = checkpoints_.save(model_, *optimizer_, progress_, config_, world_.size);
    spdlog::info("checkpoint: {}", path.string());
  }
  communicator_->all_reduce_sum(0.0);
  return path;
}

// A signal reaches one rank (Slurm signals them all, a Ctrl-C only the launcher's): the ranks
// agree at each step boundary, so that all of them checkpoint and stop together.
bool TrainingRun::any_rank_asked_to_stop() {
  return communicator_->all_reduce_sum(stop_requested() != 0 ? 1.0 : 0.0) > 0;
}

}  // namespace

void train(const Config& config, const std::string& resume, const World& world) {
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  TrainingRun(config, resume, world).run();
}

Evaluation evaluate_weights(const Config& config, const std::filesystem::path& weights) {
  const std::filesystem::path file = find_weights(weights);
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  check_tokenizer(config);
  const c10::Device device = resolve_device(config.train.device);
  const bool bf16 = use_bf16_autocast(config.train.precision, device);
  const TokenWindows val_windows = open_windows(config.data.val, config, "val");
  Llama model(config.model);
  load_model_weights(model, file);
  model->to(device);
  const auto single_rank = make_communicator(World(), false);
  const Evaluation evaluation = evaluate(model, val_windows, {config.data.micro_batch, config.data.grad_accum, 1},
                                         config.train.eval_batches, device, bf16, *single_rank);
  spdlog::info("{}: val loss {:.4f} | val ppl {:.2f} | {} tokens", file.string(), evaluation.loss,
               evaluation.perplexity, evaluation.tokens);
  if (std::filesystem::is_directory(config.train.run_dir)) {
    MetricsLog(std::filesystem::path(config.train.run_dir) / "metrics.jsonl")
        .write({{"event", "eval_only"}, {"weights", file.string()}, {"val_loss", evaluation.loss},
                {"val_ppl", evaluation.perplexity}});
  }
  return evaluation;
}

}  // namespace mltrain
