#include "trainer/run/train_step.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <optional>

#include "model/kernels/autocast_region.h"
#include "trainer/optim/clipping.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/run/wall_clock.h"

namespace mltrain {

at::Tensor window_loss(Llama& model, const at::Tensor& window, c10::Device device, bool bf16,
                       const std::optional<PackedDocuments>& documents,
                       const at::Tensor& target_weights) {
  const int64_t length = window.size(1) - 1;
  const AutocastGuard autocast(device, bf16);
  return model->loss(window.narrow(1, 0, length), window.narrow(1, 1, length),
                     documents ? &*documents : nullptr, target_weights);
}

at::Tensor masked_target_weights(const at::Tensor& target_mask, int64_t step_targets,
                                 int world_size, c10::Device device) {
  const double scale =
      step_targets > 0 ? static_cast<double>(world_size) / static_cast<double>(step_targets) : 0.0;
  return target_mask.to(device, /*non_blocking=*/true).to(at::kFloat).mul_(scale);
}

std::optional<PackedDocuments> documents_of(const at::Tensor& windows,
                                            std::optional<int64_t> document_start,
                                            c10::Device device) {
  if (!document_start) return std::nullopt;
  const at::Tensor read = windows.narrow(1, 0, windows.size(1) - 1);
  return pack_documents(read, *document_start, /*pin_memory=*/device.is_cuda()).to(device);
}

// The step's phases are named scopes (RECORD_USER_SCOPE) that torch's profiler shows in a trace
// (train.profile_steps); without a profiler they cost a flag's test.

at::Tensor forward_backward(Llama& model, const at::Tensor& window, int64_t grad_accum,
                            c10::Device device, bool bf16,
                            const std::optional<PackedDocuments>& documents,
                            const at::Tensor& target_weights) {
  at::Tensor loss;
  {
    RECORD_USER_SCOPE("mltrain::forward");
    loss = window_loss(model, window, device, bf16, documents, target_weights);
    if (!target_weights.defined()) loss = loss / static_cast<double>(grad_accum);
  }
  RECORD_USER_SCOPE("mltrain::backward");
  loss.backward();
  return loss.detach();
}

namespace {

// A micro-batch of windows on the device, the documents packed into them with document
// masking, and the weights of their targets with loss masks.
struct DeviceWindows {
  at::Tensor tokens;
  std::optional<PackedDocuments> documents;
  at::Tensor target_weights;
  int64_t step_targets = 0;
};

DeviceWindows next_windows(const StepParts& parts, int64_t step) {
  RECORD_USER_SCOPE("mltrain::data");
  const MicroBatch batch = parts.loader.next();
  if (parts.hooks.read_windows) parts.hooks.read_windows(step, parts.rank, batch.windows);
  DeviceWindows windows{batch.tokens.to(parts.device, /*non_blocking=*/true),
                        documents_of(batch.tokens, parts.document_start, parts.device),
                        {},
                        batch.step_targets};
  if (batch.target_mask.defined()) {
    windows.target_weights = masked_target_weights(batch.target_mask, batch.step_targets,
                                                   parts.communicator.size(), parts.device);
  }
  return windows;
}

// The gradients averaged over the ranks (under ZeRO-1, this rank's part of them), and the loss,
// in double so that the ranks' sum rounds as little as a host sum would.
ReducedGradients reduce(const StepParts& parts, const at::Tensor& loss, StepResult& result) {
  RECORD_USER_SCOPE("mltrain::reduce");
  ReducedGradients gradients = parts.optimizer.reduce_gradients();
  result.loss = loss.to(at::kDouble);
  parts.communicator.all_reduce_average(result.loss)->wait();
  if (parts.hooks.after_loss) parts.hooks.after_loss(result.step, result.loss);
  return gradients;
}

// Clip, then update at the scheduled learning rate. A non-finite loss or gradient would poison the
// weights and the moments for good, and a loss spike (spike_guard.h) would set them back: the
// update is skipped, on the device. Every rank sees the same averaged loss and norm, so all skip
// together.
void update(const StepParts& parts, const ReducedGradients& gradients, int64_t step,
            StepResult& result) {
  RECORD_USER_SCOPE("mltrain::optimizer");
  result.grad_norm = clip_by_global_norm(gradients, parts.optim.grad_clip);
  result.lr = learning_rate(parts.optim, parts.max_steps, step);
  result.loss_level = parts.spike_guard.level_now();
  result.skipped = (at::logical_not(at::isfinite(result.loss) & at::isfinite(result.grad_norm)) |
                    parts.spike_guard.is_spike(result.loss))
                       .to(at::kFloat);
  parts.optimizer.update(result.lr, result.skipped);
  parts.spike_guard.follow(result.loss, result.skipped);
}

}  // namespace

StepResult train_step(const StepParts& parts, int64_t step) {
  const double waited_before = parts.loader.waited_seconds();
  const Clock::time_point started = Clock::now();
  StepResult result;
  result.step = step;

  // Loss and backward of each micro-batch. The gradients accumulate; the last backward also
  // averages them over the ranks, as far as it can while it runs. Under bf16 autocast the weights
  // are cast once for all the micro-batches, except with activation checkpointing, which keeps
  // the casts of one block at a time to save memory (the memory plan counts on that), and under
  // ZeRO-3, whose units are whole only while they run and are gathered in bf16 already
  // (dist/unit_shards.h): nothing is cast. Autocast caches the casts of weights that train only:
  // LoRA's frozen weights are cast again each micro-step.
  at::Tensor loss = at::zeros({}, at::TensorOptions().device(parts.device));
  {
    std::optional<WeightCastCache> casts;
    if (!parts.model->activation_checkpointing() && !parts.model->has_unit_hooks()) casts.emplace();
    for (int64_t micro = 0; micro < parts.grad_accum; ++micro) {
      parts.optimizer.set_sync(micro + 1 == parts.grad_accum);
      const DeviceWindows windows = next_windows(parts, step);
      loss += forward_backward(parts.model, windows.tokens, parts.grad_accum, parts.device,
                               parts.bf16, windows.documents, windows.target_weights);
      result.targets = windows.step_targets;
    }
  }

  const ReducedGradients gradients = reduce(parts, loss, result);
  const Clock::time_point reduced = Clock::now();
  result.data_ms = (parts.loader.waited_seconds() - waited_before) * 1e3;
  result.forward_backward_ms = seconds_between(started, reduced) * 1e3 - result.data_ms;
  if (parts.hooks.after_gradients) parts.hooks.after_gradients(step, parts.rank, gradients.tensors);

  update(parts, gradients, step, result);
  result.optimizer_ms = seconds_since(reduced) * 1e3;
  return result;
}

}  // namespace mltrain
