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
      grad_views_(parameters_.size()),
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
      grad_views_[i] = bucket.buffer.narrow(0, bucket.offsets[k], parameters_[i].numel())
                           .view(parameters_[i].sizes());
      parameters_[i].mutable_grad() = grad_views_[i];
      bucket_of_[i] = b;
      torch::autograd::impl::set_post_acc_grad_hooks(
          parameters_[i], std::make_unique<ReadyHook>([this, i] { on_gradient(i); }));
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

void GradReducer::on_gradient(size_t parameter) {
  keep_in_bucket(parameter);
  if (sync_) mark_ready(parameter);
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
  // Parameters that backward did not reach have had no hook to check their .grad.
  for (size_t i = 0; i < parameters_.size(); ++i) keep_in_bucket(i);
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

bool overlap_all_reduce(const std::string& overlap, c10::Device device) {
  if (overlap == "auto") return device.is_cuda();
  return overlap == "true";
}

}  // namespace mltrain
