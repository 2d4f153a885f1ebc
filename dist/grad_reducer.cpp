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
                         ReducerOptions options)
    : parameters_(std::move(parameters)),
      grad_views_(parameters_.size()),
      bucket_of_(parameters_.size()),
      communicator_(communicator),
      options_(options) {
  // Assign parameters to buckets, last registered first.
  int64_t capacity = static_cast<int64_t>(options_.first_bucket_mb * (1 << 20));
  int64_t filled = 0;
  std::vector<std::vector<size_t>> members(1);
  for (size_t i = parameters_.size(); i-- > 0;) {
    const int64_t bytes = parameters_[i].numel() * parameters_[i].element_size();
    if (!members.back().empty() && filled + bytes > capacity) {
      members.emplace_back();
      filled = 0;
      capacity = static_cast<int64_t>(options_.bucket_mb * (1 << 20));
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
    if (options_.shard) {  // every rank's part equally long; the padding stays zero
      const int64_t ranks = communicator_.size();
      elements = (elements + ranks - 1) / ranks * ranks;
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
    if (options_.compress_bf16)
      bucket.wire = at::empty_like(bucket.buffer, bucket.buffer.options().dtype(at::kBFloat16));
    bucket.parameters = members[b];
    bucket.pending = members[b].size();
    buckets_.push_back(std::move(bucket));
    if (options_.shard) shard_bucket(b);
  }
}

// Moves the bucket's parameters into one flat tensor of the bucket's layout and notes this rank's
// part of it.
void GradReducer::shard_bucket(size_t b) {
  Bucket& bucket = buckets_[b];
  BucketShard shard;
  shard.bucket = at::zeros_like(bucket.buffer);
  for (size_t k = 0; k < bucket.parameters.size(); ++k) {
    const size_t i = bucket.parameters[k];
    shard.members.push_back({i, bucket.offsets[k]});
    const at::Tensor place = shard.bucket.narrow(0, bucket.offsets[k], parameters_[i].numel())
                                 .view(parameters_[i].sizes());
    place.copy_(parameters_[i]);
    // The parameter keeps its identity (the model, autograd and the optimizer hold it), and its
    // values now live in the bucket.
    parameters_[i].set_data(place);
  }
  shard.elements = part_numel(bucket.buffer, communicator_.size());
  shard.begin = communicator_.rank() * shard.elements;
  shard.parameters = shard.bucket.narrow(0, shard.begin, shard.elements);
  shard.gradients = at::zeros({shard.elements}, bucket.buffer.options());
  if (options_.compress_bf16)
    bucket.wire_part = at::empty_like(shard.gradients, bucket.wire.options());
  shards_.push_back(std::move(shard));
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
  if (options_.shard) {
    const at::Tensor& part = options_.compress_bf16 ? bucket.wire_part : shards_[b].gradients;
    bucket.work = communicator_.reduce_scatter_average(sent, part);
  } else {
    bucket.work = communicator_.all_reduce_average(sent);
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
      if (options_.shard) {
        shards_[b].gradients.copy_(bucket.wire_part);
      } else {
        bucket.buffer.copy_(bucket.wire);
      }
    }
    bucket.pending = bucket.parameters.size();
  }
  next_to_launch_ = 0;
}

void GradReducer::gather_parameters() {
  // A parameter whose storage was replaced (set_data, a module's to()) would no longer see its
  // bucket, and every rank would train on stale weights alike. (A module that swaps in another
  // parameter tensor altogether is beyond this check: the reducer still holds the old one.)
  for (const BucketShard& shard : shards_) {
    const auto* first = static_cast<const char*>(shard.bucket.data_ptr());
    for (const Member& member : shard.members) {
      const void* place = first + member.offset * shard.bucket.element_size();
      if (parameters_[member.parameter].data_ptr() != place)
        throw std::logic_error("a sharded parameter no longer lives in its bucket");
    }
  }
  // One bucket at a time, as finish() reduces them.
  for (const BucketShard& shard : shards_) communicator_.all_gather(shard.bucket)->wait();
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
