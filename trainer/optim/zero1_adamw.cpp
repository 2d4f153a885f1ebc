#include "trainer/optim/zero1_adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>
#include <string>
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
      named_(parameters),
      parameters_(tensors_of(parameters)),
      buckets_(lay_out(parameters_, options.buckets, communicator.size())),
      reducer_(parameters_, layouts_of(buckets_), communicator,
               {.overlap = options.overlap,
                .compress_bf16 = options.compress_bf16,
                .scatter = true,
                .release_buckets = options.shard_gradients}),
      update_(options.adamw,
              parameters_.empty() ? c10::Device(c10::kCPU) : parameters_.front().device()) {
  move_into_buckets();
  const int ranks = communicator_.size();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const int64_t elements = bucket.layout.part_elements(ranks);
    Part part{communicator_.rank() * elements,
              bucket.weights.narrow(0, communicator_.rank() * elements, elements),
              reducer_.averaged_parts()[b],
              {},
              {}};
    part.exp_avg = at::zeros_like(part.weights);
    part.exp_avg_sq = at::zeros_like(part.weights);
    add_pieces_to_update(bucket, part);
    parts_.push_back(std::move(part));
  }
  update_.set_grads(/*decay=*/true, decayed_grads_);
  update_.set_grads(/*decay=*/false, other_grads_);
}

std::vector<Zero1AdamW::Bucket> Zero1AdamW::lay_out(const std::vector<at::Tensor>& parameters,
                                                    BucketSizes sizes, int ranks) {
  std::vector<Bucket> buckets;
  for (BucketLayout& layout : assign_buckets(parameters, sizes, ranks))
    buckets.push_back({std::move(layout), {}});
  return buckets;
}

// Moves each bucket's parameters into one flat tensor of the bucket's layout. Each parameter keeps
// its identity (the model, autograd and the checkpoints hold it), and its values now live in the
// bucket.
void Zero1AdamW::move_into_buckets() {
  at::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    bucket.weights = at::zeros({bucket.layout.elements}, parameters_.front().options());
    for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
      at::Tensor& parameter = parameters_[bucket.layout.members[k]];
      const at::Tensor place = bucket.layout.member_view(bucket.weights, k, parameter.sizes());
      place.copy_(parameter);
      parameter.set_data(place);
    }
  }
}

// Cuts the part at its parameters' edges into pieces, and adds each to AdamW's group of its
// parameter: decayed or not.
void Zero1AdamW::add_pieces_to_update(const Bucket& bucket, const Part& part) {
  const int64_t begin = part.begin;
  const int64_t end = part.begin + part.weights.numel();
  for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
    const at::Tensor& parameter = parameters_[bucket.layout.members[k]];
    // The piece of the parameter within this rank's part, in the part's coordinates.
    const int64_t first = std::max(bucket.layout.offsets[k], begin);
    const int64_t last = std::min(bucket.layout.offsets[k] + parameter.numel(), end);
    if (first >= last) continue;
    const auto piece = [&](const at::Tensor& values) {
      return values.narrow(0, first - begin, last - first);
    };
    update_.add(piece(part.weights), piece(part.exp_avg), piece(part.exp_avg_sq),
                decays(parameter));
    (decays(parameter) ? decayed_grads_ : other_grads_).push_back(piece(part.gradients));
  }
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
  update_.step(lr, skip);
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

// The whole bucket of `values`, one of the part's moments, on every rank.
at::Tensor Zero1AdamW::gather_bucket(const Bucket& bucket, const Part& part,
                                     const at::Tensor& values) const {
  const at::Tensor whole = at::zeros_like(bucket.weights);
  whole.narrow(0, part.begin, values.numel()).copy_(values);
  communicator_.all_gather(whole)->wait();
  return whole;
}

OptimizerState Zero1AdamW::state() const {
  at::NoGradGuard no_grad;
  const bool keep = communicator_.rank() == 0;
  OptimizerState state;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const Part& part = parts_[b];
    for (const auto& [suffix, moment] :
         {std::pair{".exp_avg", part.exp_avg}, std::pair{".exp_avg_sq", part.exp_avg_sq}}) {
      const at::Tensor whole = gather_bucket(bucket, part, moment);
      if (!keep) continue;
      const at::Tensor on_host = whole.to(at::kCPU);
      for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
        add_by_part(state, member(bucket, k),
                    bucket.layout.member_view(on_host, k, member(bucket, k).tensor.sizes()),
                    suffix);
      }
    }
    if (!keep) continue;
    const at::Tensor steps = update_.step_count().to(at::kCPU);
    for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
      for (const ParameterPart& part : member(bucket, k).parts)
        state.emplace(part.name + ".step", steps);
    }
  }
  return state;
}

void Zero1AdamW::load_state(const OptimizerState& saved, const std::string& source) {
  at::NoGradGuard no_grad;
  // Everything is checked before anything changes.
  std::string first_step;  // any part's: every parameter takes every step
  for (const NamedParameter& parameter : named_) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"})
      check_saved_parts(saved, parameter, suffix, source);
    for (const ParameterPart& part : parameter.parts) {
      saved_entry(saved, part.name + ".step", {}, source);
      if (first_step.empty()) first_step = part.name + ".step";
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    Part& part = parts_[b];
    for (auto& [suffix, moment] :
         {std::pair{".exp_avg", part.exp_avg}, std::pair{".exp_avg_sq", part.exp_avg_sq}}) {
      const at::Tensor whole =
          at::zeros({bucket.layout.elements}, moment.options().device(at::kCPU));
      for (size_t k = 0; k < bucket.layout.members.size(); ++k) {
        const NamedParameter& parameter = member(bucket, k);
        copy_saved_parts(saved, parameter, suffix,
                         bucket.layout.member_view(whole, k, parameter.tensor.sizes()));
      }
      at::Tensor(moment).copy_(whole.narrow(0, part.begin, moment.numel()));
    }
  }
  if (!first_step.empty()) at::Tensor(update_.step_count()).copy_(saved.at(first_step));
}

int64_t Zero1AdamW::state_bytes() const {
  size_t bytes = update_.step_count().nbytes();
  for (const Part& part : parts_) bytes += part.exp_avg.nbytes() + part.exp_avg_sq.nbytes();
  return static_cast<int64_t>(bytes);
}

}  // namespace mltrain
