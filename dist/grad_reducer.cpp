#include "dist/grad_reducer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>

namespace mltrain {
namespace {

class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  void operator()(const torch::autograd::Variable&) override { on_ready_(); }

 private:
  std::function<void()> on_ready_;
};

}  // namespace

GradReducer::GradReducer(std::vector<at::Tensor> parameters, std::vector<BucketLayout> buckets,
                         Communicator& communicator, ReducerOptions options)
    : parameters_(std::move(parameters)),
      grad_views_(parameters_.size()),
      bucket_of_(parameters_.size()),
      member_of_(parameters_.size()),
      communicator_(communicator),
      options_(options) {
  check_layout(buckets);
  if (options_.release_buckets && !options_.scatter)
    throw std::invalid_argument("GradReducer: only scattered buckets are released");
  at::NoGradGuard no_grad;
  for (BucketLayout& layout : buckets) {
    const size_t b = buckets_.size();
    Bucket bucket;
    const at::TensorOptions options = parameters_.at(layout.members.front()).options();
    bucket.options = options;
    if (!options_.release_buckets) bucket.buffer = at::zeros({layout.elements}, options);
    for (size_t k = 0; k < layout.members.size(); ++k) {
      const size_t i = layout.members[k];
      if (parameters_[i].grad().defined()) {
        throw std::invalid_argument("GradReducer must be set up before the first backward");
      }
      if (!options_.release_buckets) {
        grad_views_[i] = layout.member_view(bucket.buffer, k, parameters_[i].sizes());
        parameters_[i].mutable_grad() = grad_views_[i];
      }
      bucket_of_[i] = b;
      member_of_[i] = k;
      torch::autograd::impl::set_post_acc_grad_hooks(
          parameters_[i], std::make_unique<ReadyHook>([this, i] { on_gradient(i); }));
    }
    if (options_.compress_bf16 && !options_.release_buckets)
      bucket.wire = at::empty({layout.elements}, options.dtype(at::kBFloat16));
    if (options_.scatter) {
      averaged_parts_.push_back(at::zeros({layout.part_elements(communicator_.size())}, options));
      if (options_.compress_bf16 && !options_.release_buckets)
        bucket.wire_part = at::empty_like(averaged_parts_.back(), options.dtype(at::kBFloat16));
    }
    bucket.pending = layout.members.size();
    bucket.layout = std::move(layout);
    buckets_.push_back(std::move(bucket));
  }
  if (options_.release_buckets) make_receiving_buffers();
}

// Released: each micro-step's part of a bucket is received in one of a few buffers of the largest
// part, taken in turn (as many as may be in flight: one, or two with overlap), rather than in a
// buffer of each bucket's own, which would hold another part of every gradient for the whole run.
void GradReducer::make_receiving_buffers() {
  if (averaged_parts_.empty()) return;
  int64_t largest = 0;
  for (const at::Tensor& part : averaged_parts_) largest = std::max(largest, part.numel());
  at::TensorOptions options = averaged_parts_.front().options();
  if (options_.compress_bf16) options = options.dtype(at::kBFloat16);
  for (int i = 0; i < (options_.overlap ? 2 : 1); ++i)
    receiving_.push_back(at::empty({largest}, options));
}

at::Tensor GradReducer::receiving_part(size_t bucket) const {
  return receiving_[bucket % receiving_.size()].narrow(0, 0, averaged_parts_[bucket].numel());
}

// Every parameter in exactly one bucket, inside it, and each bucket cut into equal parts when
// scattered: a layout that breaks these would leave a gradient without its bucket or a hook that
// never fires.
void GradReducer::check_layout(const std::vector<BucketLayout>& buckets) const {
  std::vector<int> placed(parameters_.size(), 0);
  for (const BucketLayout& layout : buckets) {
    if (layout.members.empty() || layout.members.size() != layout.offsets.size())
      throw std::invalid_argument(
          "GradReducer: a bucket without members, or without their offsets");
    for (size_t k = 0; k < layout.members.size(); ++k) {
      const size_t i = layout.members[k];
      if (i >= parameters_.size() || layout.offsets[k] < 0 ||
          layout.offsets[k] + parameters_[i].numel() > layout.elements)
        throw std::invalid_argument("GradReducer: a bucket member outside its bucket");
      ++placed[i];
    }
    if (options_.scatter && layout.elements % communicator_.size() != 0)
      throw std::invalid_argument("GradReducer: a scattered bucket not cut into equal parts");
  }
  for (const int times : placed)
    if (times != 1)
      throw std::invalid_argument("GradReducer: a parameter not in exactly one bucket");
}

GradReducer::~GradReducer() {
  for (const at::Tensor& parameter : parameters_)
    torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
}

void GradReducer::on_gradient(size_t parameter) {
  if (options_.release_buckets) {
    take_into_bucket(parameter);
    mark_ready(parameter);
    return;
  }
  keep_in_bucket(parameter);
  if (sync_) mark_ready(parameter);
}

void GradReducer::set_sync(bool sync) {
  sync_ = sync;
  if (options_.release_buckets) flush_released();
}

// Released: the gradient goes into its bucket, made when the first of its gradients arrives, and
// the .grad is let go, so that autograd makes the next micro-step's afresh.
void GradReducer::take_into_bucket(size_t parameter) {
  std::lock_guard lock(mutex_);
  at::NoGradGuard no_grad;
  Bucket& bucket = buckets_[bucket_of_[parameter]];
  at::Tensor& grad = parameters_[parameter].mutable_grad();
  if (!bucket.buffer.defined()) {
    bucket.buffer = at::zeros({bucket.layout.elements}, bucket.options);
    if (options_.compress_bf16)
      bucket.wire = at::empty_like(bucket.buffer, bucket.buffer.options().dtype(at::kBFloat16));
  }
  if (grad.defined()) {
    bucket.layout.member_view(bucket.buffer, member_of_[parameter], parameters_[parameter].sizes())
        .add_(grad.is_sparse() ? grad.to_dense() : grad);
  }
  grad = at::Tensor();
  received_any_ = true;
}

void GradReducer::keep_in_bucket(size_t parameter) {
  at::Tensor& grad = parameters_[parameter].mutable_grad();
  const at::Tensor& view = grad_views_[parameter];
  if (grad.defined() && grad.is_alias_of(view) && grad.data_ptr() == view.data_ptr() &&
      grad.strides() == view.strides()) {
    return;
  }
  at::NoGradGuard no_grad;
  if (!grad.defined()) {
    view.zero_();  // an undefined .grad is a zero gradient
  } else {
    view.copy_(grad.is_sparse() ? grad.to_dense() : grad);
  }
  grad = view;
  ++copied_in_;
}

void GradReducer::mark_ready(size_t parameter) {
  std::lock_guard lock(mutex_);
  Bucket& bucket = buckets_[bucket_of_[parameter]];
  if (bucket.pending == 0) throw std::logic_error("a gradient arrived twice in one backward");
  --bucket.pending;
  if (bucket.pending == 0 && options_.on_bucket_complete)
    options_.on_bucket_complete(bucket_of_[parameter]);
  if (options_.release_buckets) {
    launch_ready_buckets();
    // Without overlap each bucket is reduced at once (an MPI rank advances it only while it
    // waits); with it, one stays in flight while the next fills. The last ends the micro-step.
    settle_released(next_to_launch_ == buckets_.size() || !options_.overlap ? 0 : 1);
    if (next_to_settle_ == buckets_.size()) end_micro_step();
  } else if (options_.overlap) {
    launch_ready_buckets();
  }
}

// Released: waits for the buckets launched, oldest first, until at most `in_flight` are left;
// each one's part of the average is added to this rank's, and its whole gradients let go.
void GradReducer::settle_released(size_t in_flight) {
  while (next_to_launch_ - next_to_settle_ > in_flight) {
    const size_t b = next_to_settle_++;
    Bucket& bucket = buckets_[b];
    bucket.work->wait();
    bucket.work.reset();
    averaged_parts_[b].add_(receiving_part(b));
    bucket.buffer = at::Tensor();
    bucket.wire = at::Tensor();
  }
}

void GradReducer::flush_released() {
  std::lock_guard lock(mutex_);
  end_micro_step();
}

// Released, with the mutex held: ends the micro-step. Buckets that backward did not complete (a
// parameter it did not reach has a zero gradient) are made, reduce-scattered in order and let go,
// as on every rank; a micro-step in which no gradient arrived at all (before the first backward)
// sends nothing.
void GradReducer::end_micro_step() {
  if (!received_any_ && next_to_launch_ == 0) return;
  at::NoGradGuard no_grad;
  while (next_to_launch_ < buckets_.size()) {
    Bucket& bucket = buckets_[next_to_launch_];
    if (!bucket.buffer.defined()) {
      const at::Tensor& averaged = averaged_parts_[next_to_launch_];
      bucket.buffer = at::zeros({bucket.layout.elements}, averaged.options());
      if (options_.compress_bf16)
        bucket.wire = at::empty_like(bucket.buffer, averaged.options().dtype(at::kBFloat16));
    }
    launch_next_bucket();
    settle_released(0);
  }
  settle_released(0);
  for (Bucket& bucket : buckets_) bucket.pending = bucket.layout.members.size();
  next_to_launch_ = 0;
  next_to_settle_ = 0;
  received_any_ = false;
}

// Launches buckets strictly in order, so that every rank issues the same sequence of collectives
// whatever order its gradients arrive in.
void GradReducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0)
    launch_next_bucket();
}

void GradReducer::launch_next_bucket() {
  // Released: the buffer this bucket is received in is free once the buckets before it that took
  // it are settled.
  if (options_.release_buckets) settle_released(receiving_.size() - 1);
  const size_t b = next_to_launch_++;
  Bucket& bucket = buckets_[b];
  if (options_.compress_bf16) bucket.wire.copy_(bucket.buffer);
  const at::Tensor& sent = options_.compress_bf16 ? bucket.wire : bucket.buffer;
  if (options_.scatter) {
    const at::Tensor part = options_.release_buckets ? receiving_part(b)
                            : options_.compress_bf16 ? bucket.wire_part
                                                     : averaged_parts_[b];
    bucket.work = communicator_.reduce_scatter_average(sent, part, static_cast<int>(b));
  } else {
    bucket.work = communicator_.all_reduce_average(sent, static_cast<int>(b));
  }
}

void GradReducer::finish() {
  if (options_.release_buckets) {
    flush_released();
    average_parts_across_replicas();
    return;
  }
  // Parameters that backward did not reach have had no hook to check their .grad.
  for (size_t i = 0; i < parameters_.size(); ++i) keep_in_bucket(i);
  std::lock_guard lock(mutex_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // The buckets that backward did not launch (all of them without overlap) go one at a time:
    // each nonblocking MPI collective holds temporary buffers as large as its bucket until it
    // completes, and all of them in flight together raised the peak by 714 MiB on a 297M model
    // (bench/RESULTS.md), for nothing: an MPI rank advances its collectives only inside its MPI
    // calls. NCCL's wait only orders the streams, so the host does not stall there either.
    if (next_to_launch_ == b) launch_next_bucket();
    Bucket& bucket = buckets_[b];
    bucket.work->wait();
    bucket.work.reset();
    if (options_.compress_bf16) {
      if (options_.scatter) {
        averaged_parts_[b].copy_(bucket.wire_part);
      } else {
        bucket.buffer.copy_(bucket.wire);
      }
    }
    bucket.pending = bucket.layout.members.size();
  }
  next_to_launch_ = 0;
  average_parts_across_replicas();
}

// Scattered, each part holds the average over this rank's group (summed over the micro-steps when
// released); with replicas (hybrid sharding) it is averaged with the other groups' now, once a
// step.
void GradReducer::average_parts_across_replicas() {
  std::vector<std::unique_ptr<CollectiveWork>> works;
  for (const at::Tensor& part : averaged_parts_)
    works.push_back(communicator_.average_across_replicas(part));
  for (const auto& work : works) work->wait();
}

void GradReducer::zero_grad() {
  at::NoGradGuard no_grad;
  if (options_.release_buckets) {
    for (at::Tensor& part : averaged_parts_) part.zero_();
    return;
  }
  for (Bucket& bucket : buckets_) bucket.buffer.zero_();
}

bool overlap_all_reduce(const std::string& overlap, c10::Device device) {
  if (overlap == "auto") return device.is_cuda();
  return overlap == "true";
}

}  // namespace mltrain
