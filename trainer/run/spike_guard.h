#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

namespace mltrain {

// The loss-spike guard (train.spike_guard): a step whose loss is more than `factor` times the
// running level of the losses of the steps applied before it is not applied, as a non-finite step
// is not, so that one bad batch does not go into the weights and the moments. The level, an
// exponential average over about the last ten applied steps, lives on the device: no step waits
// for the host to decide. A level under 0.1 nats is judged as 0.1.
class SpikeGuard {
 public:
  // `factor` 0: off. `level`: a checkpoint's, or 0 where no step was applied yet.
  SpikeGuard(double factor, double level, c10::Device device);

  // Whether `loss` (a double scalar on the device) is a spike: a bool scalar on the device.
  at::Tensor is_spike(const at::Tensor& loss) const;
  // After a step: the level follows its `loss` unless the step was `skipped` (a scalar, nonzero
  // for skipped).
  void follow(const at::Tensor& loss, const at::Tensor& skipped);

  // The level the next step is judged by, on the device: a copy.
  at::Tensor level_now() const { return level_.clone(); }
  // The same on the host: it waits for the device (a checkpoint's).
  double level() const;

 private:
  double factor_;
  at::Tensor level_;  // double scalar
};

}  // namespace mltrain
