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

GradReducer::GradReducer(std::vector<at::Tensor> parameters, std::vector<BucketLayout> buckets,
                         Communicator& communicator, ReducerOptions options)
    : parameters_(std::move(parameters)),
      grad_views_(parameters_.size()),
      bucket_of_(parameters_.size()),
      communicator_(communicator),
      options_(options) {
  check_layout(buckets);
  at::NoGradGuard no_grad;
  for (BucketLayout& layout : buckets) {
    const size_t b = buckets_.size();
    Bucket bucket;
    bucket.buffer = at::zeros({layout.elements}, parameters_.at(layout.members.front()).options());
    for (size_t k = 0; k < layout.members.size(); ++k) {
      const size_t i = layout.members[k];
      if (parameters_[i].grad().defined()) {
        throw std::invalid_argument("GradReducer must be set up before the first backward");
      }
      grad_views_[i] = layout.member_view(bucket.buffer, k, parameters_[i].sizes());
      parameters_[i].mutable_grad() = grad_views_[i];
      bucket_of_[i] = b;
      torch::autograd::impl::set_post_acc_grad_hooks(
          parameters_[i], std::make_unique<ReadyHook>([this, i] { on_gradient(i); }));
    }
    if (options_.compress_bf16)
      bucket.wire = at::empty_like(bucket.buffer, bucket.buffer.options().dtype(at::kBFloat16));
    if (options_.scatter) {
      averaged_parts_.push_back(
          at::zeros({layout.part_elements(communicator_.size())}, bucket.buffer.options()));
      if (options_.compress_bf16)
        bucket.wire_part = at::empty_like(averaged_parts_.back(), bucket.wire.options());
    }
    bucket.pending = layout.members.size();
    bucket.layout = std::move(layout);
    buckets_.push_back(std::move(bucket));
  }
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
  if (options_.overlap) launch_ready_buckets();
}

// Launches buckets strictly in order, so that every rank issues the same sequence of collectives
// whatever order its gradients arrive in.
void GradReducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0)
    launch_next_bucket();
}

void GradReducer::launch_next_bucket() {
  const size_t b = next_to_launch_++;
  Bucket& bucket = buckets_[b];
  if (options_.compress_bf16) bucket.wire.copy_(bucket.buffer);
  const at::Tensor& sent = options_.compress_bf16 ? bucket.wire : bucket.buffer;
  if (options_.scatter) {
    const at::Tensor& part = options_.compress_bf16 ? bucket.wire_part : averaged_parts_[b];
    bucket.work = communicator_.reduce_scatter_average(sent, part, static_cast<int>(b));
  } else {
    bucket.work = communicator_.all_reduce_average(sent, static_cast<int>(b));
  }
}

void GradReducer::finish() {
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
