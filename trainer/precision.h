#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "model/llama.h"

namespace mltrain {

// Mixed precision for the forward pass: with train.precision bf16, matmuls and attention run in
// bf16 under autocast while the weights, the optimizer state and the loss stay fp32. Constructed
// around the forward pass only (backward replays the recorded dtypes), it enables autocast for the
// device with an explicit dtype and, when it ends, restores the previous state and clears the
// autocast cache of casted weights, which are stale once the optimizer steps.
class AutocastGuard {
 public:
  AutocastGuard(c10::Device device, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool enabled_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
};

// Whether this CPU multiplies bf16 in hardware (AMX-BF16 or AVX512-BF16), where oneDNN's bf16
// matmuls beat fp32 (1.7x on a Xeon with AMX); elsewhere bf16 is emulated, and slower than fp32.
bool cpu_has_bf16_units();

// What train.precision resolves to on a device, and why, in words for the log.
struct PrecisionChoice {
  bool bf16;
  bool emulated;  // bf16 on a CPU without bf16 units: slower than fp32, worth a warning
  std::string reason;
};

// train.precision auto takes bf16 autocast where it is fast (CUDA, and CPUs with bf16 units) and
// fp32 elsewhere; bf16 and fp32 are taken as asked, bf16 on a CPU without the units with a reason
// that says it runs emulated. A pure function of its arguments, so that every case is testable on
// any machine.
PrecisionChoice choose_precision(const std::string& precision, c10::Device device,
                                 bool cpu_bf16_units);

// choose_precision for this machine's CPU.
PrecisionChoice precision_on_this_machine(const std::string& precision, c10::Device device);

// The choice, for the run's header: a warning when bf16 was asked for on a CPU that emulates it,
// an info line otherwise.
void log_precision(const PrecisionChoice& choice);

// precision_on_this_machine, logged; whether to run under bf16 autocast.
bool use_bf16_autocast(const std::string& precision, c10::Device device);

// The mean next-token loss of windows [B, seq_len + 1] (on the device): the model reads
// window[:, :-1], under bf16 autocast when `bf16`, and is scored against window[:, 1:]. Training
// and evaluation both compute their losses here, so that they agree on the precision policy.
at::Tensor window_loss(Llama& model, const at::Tensor& window, c10::Device device, bool bf16);

}  // namespace mltrain
