#include "dist/grad_reducer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

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

GradReducer::GradReducer(std::vector<at::Tensor> parameters, Communicator& communicator,
                         double bucket_mb, double first_bucket_mb, bool overlap, bool compress_bf16)
    : parameters_(std::move(parameters)),
      bucket_of_(parameters_.size()),
      communicator_(communicator),
      overlap_(overlap),
      compress_bf16_(compress_bf16) {
  // Assign parameters to buckets, last registered first.
  int64_t capacity = static_cast<int64_t>(first_bucket_mb * (1 << 20));
  int64_t filled = 0;
  std::vector<std::vector<size_t>> members(1);
  for (size_t i = parameters_.size(); i-- > 0;) {
    const int64_t bytes = parameters_[i].numel() * parameters_[i].element_size();
    if (!members.back().empty() && filled + bytes > capacity) {
      members.emplace_back();
      filled = 0;
      capacity = static_cast<int64_t>(bucket_mb * (1 << 20));
    }
    members.back().push_back(i);
    filled += bytes;
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < members.size(); ++b) {
    Bucket bucket;
    int64_t elements = 0;
    for (const size_t i : members[b]) {
      bucket.offsets.push_back(elements);
      elements += parameters_[i].numel();
    }
    bucket.buffer = at::zeros({elements}, parameters_[members[b].front()].options());
    for (size_t k = 0; k < members[b].size(); ++k) {
      const size_t i = members[b][k];
      if (parameters_[i].grad().defined()) {
        throw std::invalid_argument("GradReducer must be set up before the first backward");
      }
      parameters_[i].mutable_grad() =
          bucket.buffer.narrow(0, bucket.offsets[k], parameters_[i].numel())
              .view(parameters_[i].sizes());
      bucket_of_[i] = b;
      torch::autograd::impl::set_post_acc_grad_hooks(
          parameters_[i], std::make_unique<ReadyHook>([this, i] { mark_ready(i); }));
    }
    if (compress_bf16_)
      bucket.wire = at::empty_like(bucket.buffer, bucket.buffer.options().dtype(at::kBFloat16));
    bucket.parameters = members[b];
    bucket.pending = members[b].size();
    buckets_.push_back(std::move(bucket));
  }
}

GradReducer::~GradReducer() {
  for (const at::Tensor& parameter : parameters_)
    torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
}

void GradReducer::mark_ready(size_t parameter) {
  if (!sync_) return;
  std::lock_guard lock(mutex_);
  Bucket& bucket = buckets_[bucket_of_[parameter]];
  if (bucket.pending == 0) throw std::logic_error("a gradient arrived twice in one backward");
  --bucket.pending;
  if (overlap_) launch_ready_buckets(/*all=*/false);
}

// Launches buckets strictly in order, so that every rank issues the same sequence of collectives
// whatever order its gradients arrive in.
void GradReducer::launch_ready_buckets(bool all) {
  while (next_to_launch_ < buckets_.size() && (all || buckets_[next_to_launch_].pending == 0)) {
    Bucket& bucket = buckets_[next_to_launch_++];
    if (compress_bf16_) {
      bucket.wire.copy_(bucket.buffer);
      bucket.work = communicator_.all_reduce_average(bucket.wire);
    } else {
      bucket.work = communicator_.all_reduce_average(bucket.buffer);
    }
  }
}

void GradReducer::finish() {
  std::lock_guard lock(mutex_);
  launch_ready_buckets(/*all=*/true);  // buckets with unused parameters, or all without overlap
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    if (compress_bf16_) bucket.buffer.copy_(bucket.wire);
    bucket.pending = bucket.parameters.size();
  }
  next_to_launch_ = 0;
}

void GradReducer::zero_grad() {
  at::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) bucket.buffer.zero_();
}

}  // namespace mltrain
