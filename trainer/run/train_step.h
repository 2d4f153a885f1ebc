#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "data/loader.h"
#include "dist/communicator.h"
#include "model/layers/llama.h"
#include "model/layers/packed_documents.h"
#include "trainer/config/config.h"
#include "trainer/optim/optimizer.h"
#include "trainer/run/spike_guard.h"
#include "trainer/run/training_hooks.h"

namespace mltrain {

// The mean next-token loss of windows [B, seq_len + 1] (on the device): the model reads
// window[:, :-1], under bf16 autocast when `bf16` (matmuls and attention in bf16, weights and the
// loss in fp32), attending within `documents` when given (those of window[:, :-1], on the
// device), and is scored against window[:, 1:]; with `target_weights` [B, seq_len] (fp32, on the
// device), the targets' losses summed by those weights instead (loss masks). Training and
// evaluation both compute their losses here, so that they agree on the precision policy and the
// masking.
at::Tensor window_loss(Llama& model, const at::Tensor& window, c10::Device device, bool bf16,
                       const std::optional<PackedDocuments>& documents = std::nullopt,
                       const at::Tensor& target_weights = {});

// With data.document_masking (`document_start`: the end-of-document token), the documents packed
// into the part of windows [B, seq_len + 1] (on the CPU) that the model reads, moved to `device`
// without waiting for it; none without.
std::optional<PackedDocuments> documents_of(const at::Tensor& windows,
                                            std::optional<int64_t> document_start,
                                            c10::Device device);

// Forward and backward of one micro-batch of windows (already on the device): its window_loss is
// divided by grad_accum so that grad_accum calls accumulate the gradient of the step's mean loss,
// and backward runs outside autocast. Returns the divided loss, detached. With target_weights
// (masked_target_weights), the weighted loss as it is: the weights do the dividing.
at::Tensor forward_backward(Llama& model, const at::Tensor& window, int64_t grad_accum,
                            c10::Device device, bool bf16,
                            const std::optional<PackedDocuments>& documents = std::nullopt,
                            const at::Tensor& target_weights = {});

// The weights of a micro-batch's targets under loss masks, on `device`: its target mask [B, T]
// times world_size / step_targets. Summed over the micro-steps and averaged over the ranks, as
// the gradients and the loss are, the step's loss is then the mean over all of its targets that
// count, however they fall into micro-batches: not the mean of the micro-batches' means, which
// would weigh a short answer's tokens more. A step without targets weighs everything 0.
at::Tensor masked_target_weights(const at::Tensor& target_mask, int64_t step_targets,
                                 int world_size, c10::Device device);

// What one optimizer step saw and did. The loss and the gradient norm stay on the device until
// the host reads them, at the steps that log or checkpoint: on CUDA every read waits for the
// device's queue to drain, and a step that reads stalls the GPU while the host catches up.
struct StepResult {
  int64_t step = 0;
  at::Tensor loss;        // averaged over the ranks
  at::Tensor grad_norm;   // before clipping
  at::Tensor skipped;     // 1 where the update was skipped (non-finite, or a loss spike), else 0
  at::Tensor loss_level;  // the spike guard's level that the step was judged by
  double lr = 0.0;
  int64_t targets = 0;  // with loss masks, the targets the loss is the mean over; else 0
  // Host wall time: waiting for the loader, in forward and backward (with the gradients'
  // reduction), and in the clip and the update. On the CPU that is the time the work took; on
  // CUDA only the time to enqueue it, so the metrics give these on the CPU alone.
  double data_ms = 0.0;
  double forward_backward_ms = 0.0;
  double optimizer_ms = 0.0;
};

// What a training step works with, built once by the run.
struct StepParts {
  Llama& model;
  Loader& loader;
  Optimizer& optimizer;
  Communicator& communicator;
  SpikeGuard& spike_guard;
  const OptimConfig& optim;
  int64_t max_steps;   // of the learning-rate schedule
  int64_t grad_accum;  // micro-steps per step
  c10::Device device;
  bool bf16;
  std::optional<int64_t> document_start;  // with data.document_masking: where documents begin
  int rank;
  const TrainingHooks& hooks;  // the tests' faults; none in the shipped binaries
};

// One optimizer step, `step` counted from 1: each micro-batch's loss and backward, then the
// gradients reduced over the ranks, clipped, and the weights updated at the scheduled learning
// rate, unless the step went non-finite or its loss spiked. Nothing here waits for the device.
StepResult train_step(const StepParts& parts, int64_t step);

}  // namespace mltrain
