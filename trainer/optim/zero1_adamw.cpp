#include "trainer/optim/zero1_adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <stdexcept>
#include <utility>

namespace mltrain {
namespace {

std::vector<BucketLayout> layouts_of(const auto& buckets) {
  std::vector<BucketLayout> layouts;
  for (const auto& bucket : buckets) layouts.push_back(bucket.layout);
  return layouts;
}

}  // namespace

Zero1AdamW::Zero1AdamW(const NamedParameters& parameters, Communicator& communicator,
                       const DataParallelOptions& options)
    : communicator_(communicator),
      parameters_(tensors_of(parameters)),
      buckets_(move_into_buckets(parameters_, options.buckets, communicator.size())),
      reducer_(parameters_, layouts_of(buckets_), communicator,
               {.overlap = options.overlap,
                .compress_bf16 = options.compress_bf16,
                .scatter = true,
                .release_buckets = options.shard_gradients}),
      adamw_(parameters, layouts_of(buckets_), parts_of_buckets(), communicator, options.adamw) {}

// Lays out the buckets and moves each bucket's parameters into one flat tensor of its layout. Each
// parameter keeps its identity (the model, autograd and the checkpoints hold it), and its values
// now live in the bucket.
std::vector<Zero1AdamW::Bucket> Zero1AdamW::move_into_buckets(
    const std::vector<at::Tensor>& parameters, BucketSizes sizes, int ranks) {
  at::NoGradGuard no_grad;
  std::vector<Bucket> buckets;
  for (BucketLayout& layout : assign_buckets(parameters, sizes, ranks)) {
    const at::Tensor weights = at::zeros({layout.elements}, parameters.front().options());
    Bucket bucket{std::move(layout), weights};
    for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
      at::Tensor parameter = parameters[bucket.layout.members[k]];
      const at::Tensor place = bucket.layout.member_view(bucket.weights, k, parameter.sizes());
      place.copy_(parameter);
      parameter.set_data(place);
    }
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

// This rank's part of each bucket: views of its weights and of the reducer's averaged gradients.
std::vector<PartsAdamW::Part> Zero1AdamW::parts_of_buckets() const {
  std::vector<PartsAdamW::Part> parts;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t elements = buckets_[b].layout.part_elements(communicator_.size());
    const int64_t begin = communicator_.rank() * elements;
    parts.push_back({.begin = begin,
                     .weights = buckets_[b].weights.narrow(0, begin, elements),
                     .gradients = reducer_.averaged_parts()[b]});
  }
  return parts;
}

// 1. Reduce-scatter.
ReducedGradients Zero1AdamW::reduce_gradients() {
  if (reduced_) throw std::logic_error("Zero1AdamW::reduce_gradients twice in one step");
  reducer_.finish();
  reduced_ = true;
  return {reducer_.averaged_parts(), &communicator_};
}

void Zero1AdamW::update(double lr, const at::Tensor& skip) {
  if (!reduced_) throw std::logic_error("Zero1AdamW::update before reduce_gradients");
  // 2. The update of this rank's part of the weights.
  check_parameters_in_buckets();
  adamw_.step(lr, skip);
  // 3. Every rank's part to every rank, one bucket at a time, as the reducer reduces them.
  for (size_t b = 0; b < buckets_.size(); ++b)
    communicator_.all_gather(buckets_[b].weights, static_cast<int>(b))->wait();
  reducer_.zero_grad();
  reduced_ = false;
}

// A parameter whose storage was replaced (set_data, a module's to()) would no longer see its
// bucket, and every rank would train on stale weights alike. (A module that swaps in another
// parameter tensor altogether is beyond this check: the optimizer still holds the old one.)
void Zero1AdamW::check_parameters_in_buckets() const {
  for (const Bucket& bucket : buckets_) {
    const auto* first = static_cast<const char*>(bucket.weights.data_ptr());
    for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
      const void* place = first + bucket.layout.offsets[k] * bucket.weights.element_size();
      if (parameters_[bucket.layout.members[k]].data_ptr() != place)
        throw std::logic_error("a sharded parameter no longer lives in its bucket");
    }
  }
}

}  // namespace mltrain
