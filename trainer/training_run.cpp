#include "trainer/training_run.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "common/atomic_file.h"
#include "common/error.h"
#include "data/loader.h"
#include "data/tokenizer.h"
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

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string duration_text(double seconds) {
  const auto total = static_cast<int64_t>(std::lround(seconds));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, total % 3600 / 60);
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

// What every mode shares: the device, the precision and the validation data.
struct RunContext {
  c10::Device device{c10::kCPU};
  bool bf16 = false;
  BatchLayout layout;
};

RunContext prepare(const Config& config) {
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  RunContext context;
  context.device = resolve_device(config.train.device);
  context.bf16 = use_bf16_autocast(config.train.precision, context.device);
  context.layout = {config.data.micro_batch, config.data.grad_accum, /*world_size=*/1};
  if (!config.data.tokenizer.empty()) {
    const Tokenizer tokenizer(config.data.tokenizer);
    if (tokenizer.vocab_size() > config.model.vocab_size) {
      throw UserError(fmt::format("{}: the tokenizer has {} tokens, more than model.vocab_size = {}",
                                  config.data.tokenizer, tokenizer.vocab_size(), config.model.vocab_size));
    }
  }
  return context;
}

TokenWindows open_windows(const std::string& pattern, const Config& config, const char* split) {
  const auto start = Clock::now();
  TokenWindows windows(pattern, config.data.seq_len, config.model.vocab_size);
  spdlog::info("{} data: {} shards, {} tokens, {} windows of {} (validated in {:.1f} s)", split,
               windows.shards().size(), windows.num_tokens(), windows.num_windows(),
               windows.window_length(), seconds_since(start));
  return windows;
}

void log_evaluation(const Evaluation& evaluation, int64_t step, MetricsLog& metrics) {
  spdlog::info("step {} | val loss {:.4f} | val ppl {:.2f} | {} tokens", step, evaluation.loss,
               evaluation.perplexity, evaluation.tokens);
  metrics.write({{"step", step}, {"val_loss", evaluation.loss}, {"val_ppl", evaluation.perplexity}});
}

// The checkpoint `resume` names: "auto" is the newest in the run directory (none: start fresh),
// anything else a checkpoint directory.
std::optional<std::filesystem::path> checkpoint_to_resume(const std::string& resume, const CheckpointStore& store) {
  if (resume.empty()) return std::nullopt;
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

}  // namespace

void train(const Config& config, const std::string& resume) {
  const RunContext context = prepare(config);
  const TokenWindows train_windows = open_windows(config.data.train, config, "train");
  const TokenWindows val_windows = open_windows(config.data.val, config, "val");

  const std::filesystem::path run_dir = config.train.run_dir;
  std::filesystem::create_directories(run_dir);
  const CheckpointStore checkpoints(run_dir);
  checkpoints.remove_stale_temporaries();

  at::manual_seed(config.data.seed);
  Llama model(config.model);
  model->to(context.device);
  const std::vector<at::Tensor> parameters = model->parameters();
  AdamW optimizer(hf_named_parameters(model),
                  {config.optim.beta1, config.optim.beta2, config.optim.eps, config.optim.weight_decay},
                  AdamWKernel::kFused);
  TrainingProgress progress;
  const auto resume_from = checkpoint_to_resume(resume, checkpoints);
  if (resume_from) progress = load_checkpoint(*resume_from, model, optimizer, config);
  {
    AtomicFileWriter config_file(run_dir / "config.yaml");
    config_file.write(config_to_yaml(config));
    config_file.commit();
  }

  const BatchLayout& layout = context.layout;
  Loader loader(train_windows, Sampler(train_windows.num_windows(), config.data.seed, layout),
                /*rank=*/0, progress.samples_consumed, config.data.prefetch, context.device.is_cuda());
  MetricsLog metrics(run_dir / "metrics.jsonl");

  const int64_t tokens_per_step = layout.global_batch() * config.data.seq_len;
  const double flops_per_token = training_flops_per_token(config.model, model->num_parameters(), config.data.seq_len);
  const double peak_flops = peak_bf16_flops(context.device);
  const int64_t max_steps = config.train.max_steps;
  const int64_t last_step = config.train.stop_at > 0 ? std::min(config.train.stop_at, max_steps) : max_steps;
  spdlog::info("model: {} parameters, {:.1f} MFLOP per token | device: {} | precision: {}",
               model->num_parameters(), flops_per_token / 1e6, describe_device(context.device),
               context.bf16 ? "bf16 autocast, fp32 weights" : "fp32");
  spdlog::info("{} steps of {} tokens ({} windows x {} micro-steps); {:.2f} epochs of the training data",
               max_steps, tokens_per_step, layout.micro_batch, layout.grad_accum,
               static_cast<double>(max_steps * layout.global_batch()) / train_windows.num_windows());
  metrics.write({{"event", "start"}, {"step", progress.step}, {"max_steps", max_steps},
                 {"parameters", model->num_parameters()}, {"tokens_per_step", tokens_per_step},
                 {"device", describe_device(context.device)}});

  install_stop_handlers();
  const auto save_checkpoint = [&] {
    const auto path = checkpoints.save(model, optimizer, progress, config, layout.world_size);
    spdlog::info("checkpoint: {}", path.string());
    return path;
  };
  const auto run_start = Clock::now();
  const int64_t first_step = progress.step;
  double timed_seconds = 0.0;  // step time after the first step, which includes warm-up
  int64_t bad_steps_in_a_row = 0;
  for (int64_t step = first_step; step < last_step; ++step) {
    const auto step_start = Clock::now();
    const double waited_before = loader.waited_seconds();
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(context.device));
    for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
      const at::Tensor window = loader.next().tokens.to(context.device, /*non_blocking=*/true);
      loss_sum += forward_backward(model, window, layout.grad_accum, context.device, context.bf16);
    }
    if (nonfinite_gradients_injected(step)) parameters.front().mutable_grad().fill_(NAN);
    const double grad_norm = clip_grad_norm(parameters, config.optim.grad_clip);
    const double loss = loss_sum.item<double>();
    const double lr = learning_rate(config.optim, max_steps, step);
    // A non-finite loss or gradient would poison the weights and the moments for good: skip it.
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      optimizer.zero_grad();
      ++bad_steps_in_a_row;
      spdlog::warn("step {}: non-finite loss {} or gradient norm {}: update skipped ({} in a row, "
                   "train.max_bad_steps = {})",
                   step + 1, loss, grad_norm, bad_steps_in_a_row, config.train.max_bad_steps);
      metrics.write({{"step", step + 1}, {"skipped", true}, {"loss", loss}, {"grad_norm", grad_norm}});
      if (bad_steps_in_a_row >= config.train.max_bad_steps) {
        const auto latest = checkpoints.latest();
        throw std::runtime_error(fmt::format(
            "{} non-finite steps in a row: stopping; the last good checkpoint is {}", bad_steps_in_a_row,
            latest ? latest->string() : "none (no checkpoint was saved yet)"));
      }
    } else {
      bad_steps_in_a_row = 0;
      optimizer.step(lr);
      optimizer.zero_grad();
    }
    progress.step = step + 1;
    progress.samples_consumed += layout.global_batch();
    progress.tokens_seen += tokens_per_step;
    progress.learning_rate = lr;
    const double step_seconds = seconds_since(step_start);
    if (step > first_step) timed_seconds += step_seconds;

    const bool last = step + 1 == max_steps;
    if (step == first_step || (step + 1) % config.train.log_every == 0 || last) {
      const double tokens_per_s = tokens_per_step / step_seconds;
      const double flops = flops_per_token * tokens_per_s;
      const double data_ms = (loader.waited_seconds() - waited_before) * 1e3;
      const double mean_step = step > first_step ? timed_seconds / static_cast<double>(step - first_step) : step_seconds;
      const std::string speed = peak_flops > 0 ? fmt::format("MFU {:.1f}%", 100 * flops / peak_flops)
                                               : fmt::format("{:.1f} GFLOP/s", flops / 1e9);
      spdlog::info("step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} ms/step (data {:.1f} ms) | "
                   "{:.0f} tok/s | {} | mem {:.2f} GB | ETA {}",
                   step + 1, max_steps, loss, lr, grad_norm, step_seconds * 1e3, data_ms, tokens_per_s, speed,
                   peak_memory_bytes(context.device) / 1e9, duration_text(mean_step * (last_step - step - 1)));
      metrics.write({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                     {"step_ms", step_seconds * 1e3}, {"data_ms", data_ms}, {"tokens_per_s", tokens_per_s},
                     {"flops_per_s", flops}, {"elapsed_s", seconds_since(run_start)}});
    }
    if ((step + 1) % config.train.eval_every == 0 || last) {
      const Evaluation evaluation =
          evaluate(model, val_windows, layout, config.train.eval_batches, context.device, context.bf16);
      progress.best_val_loss = std::min(progress.best_val_loss, evaluation.loss);
      log_evaluation(evaluation, step + 1, metrics);
    }
    if (const int signal = stop_requested()) {
      const auto path = save_checkpoint();
      spdlog::info("stopped by {} after step {}; continue with --resume auto (or --resume {})",
                   strsignal(signal), step + 1, path.string());
      return;
    }
    if ((step + 1) % config.train.ckpt_every == 0 || step + 1 == last_step) save_checkpoint();
  }
  if (last_step < max_steps) {
    spdlog::info("stopped at train.stop_at = {}; continue with --resume auto", last_step);
    return;
  }
  spdlog::info("trained {} steps in {}", max_steps - first_step, duration_text(seconds_since(run_start)));
  draw_loss_curve(run_dir);
}

Evaluation evaluate_weights(const Config& config, const std::filesystem::path& weights) {
  const std::filesystem::path file = find_weights(weights);
  const RunContext context = prepare(config);
  const TokenWindows val_windows = open_windows(config.data.val, config, "val");
  Llama model(config.model);
  load_model_weights(model, file);
  model->to(context.device);
  const Evaluation evaluation =
      evaluate(model, val_windows, context.layout, config.train.eval_batches, context.device, context.bf16);
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
