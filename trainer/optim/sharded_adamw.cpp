#include "trainer/optim/sharded_adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace mltrain {

ShardedAdamW::ShardedAdamW(const NamedParameters& parameters, const GradReducer& reducer,
                           Communicator& communicator, AdamWOptions options)
    : communicator_(communicator),
      update_(options, reducer.parameters().empty() ? c10::Device(c10::kCPU)
                                                    : reducer.parameters().front().device()) {
  if (reducer.shards().empty() && !reducer.parameters().empty())
    throw std::invalid_argument("ShardedAdamW needs a sharded GradReducer");
  std::vector<at::Tensor> decayed_grads;  // the pieces' gradients, in the order of add()
  std::vector<at::Tensor> other_grads;
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& [name, parameter] : parameters) name_of[parameter.unsafeGetTensorImpl()] = name;

  for (const GradReducer::BucketShard& shard : reducer.shards()) {
    BucketState bucket{
        &shard, {}, {}, at::zeros_like(shard.parameters), at::zeros_like(shard.parameters)};
    const int64_t begin = shard.begin;
    const int64_t end = shard.begin + shard.elements;
    for (const GradReducer::Member& member : shard.members) {
      const at::Tensor& parameter = reducer.parameters()[member.parameter];
      const auto name = name_of.find(parameter.unsafeGetTensorImpl());
      if (name == name_of.end()) throw std::invalid_argument("a reducer parameter has no name");
      bucket.names.push_back(name->second);
      bucket.sizes.push_back(parameter.sizes().vec());
      // The piece of the parameter within this rank's part, in the part's coordinates.
      const int64_t first = std::max(member.offset, begin);
      const int64_t last = std::min(member.offset + parameter.numel(), end);
      if (first >= last) continue;
      const auto piece = [&](const at::Tensor& part) {
        return part.narrow(0, first - begin, last - first);
      };
      update_.add(piece(shard.parameters), piece(bucket.exp_avg), piece(bucket.exp_avg_sq),
                  decays(parameter));
      (decays(parameter) ? decayed_grads : other_grads).push_back(piece(shard.gradients));
    }
    gradients_.push_back(shard.gradients);
    buckets_.push_back(std::move(bucket));
  }
  update_.set_grads(/*decay=*/true, std::move(decayed_grads));
  update_.set_grads(/*decay=*/false, std::move(other_grads));
}

at::Tensor ShardedAdamW::clip_gradients(double max_norm) {
  at::NoGradGuard no_grad;
  // The padding past the last parameter is zero, and adds nothing.
  const at::Tensor squares =
      at::stack(at::_foreach_norm(gradients_, 2)).to(at::kDouble).square().sum();
  communicator_.all_reduce_average(squares)->wait();
  const at::Tensor norm = (squares * communicator_.size()).sqrt().to(at::kFloat);
  clip_to_norm(gradients_, norm, max_norm);
  return norm;
}

void ShardedAdamW::step(double lr, const at::Tensor& skip) { update_.step(lr, skip); }

// The whole bucket of `part`, one of the bucket's moments, on every rank.
at::Tensor ShardedAdamW::gather_bucket(const BucketState& bucket, const at::Tensor& part) const {
  const at::Tensor whole = at::zeros_like(bucket.shard->bucket);
  whole.narrow(0, bucket.shard->begin, bucket.shard->elements).copy_(part);
  communicator_.all_gather(whole)->wait();
  return whole;
}

OptimizerState ShardedAdamW::state() const {
  at::NoGradGuard no_grad;
  const bool keep = communicator_.rank() == 0;
  OptimizerState state;
  for (const BucketState& bucket : buckets_) {
    for (const auto& [suffix, part] :
         {std::pair{".exp_avg", bucket.exp_avg}, std::pair{".exp_avg_sq", bucket.exp_avg_sq}}) {
      const at::Tensor whole = gather_bucket(bucket, part);
      if (!keep) continue;
      const at::Tensor on_host = whole.to(at::kCPU);
      for (size_t k = 0; k < bucket.names.size(); ++k) {
        const int64_t elements = c10::multiply_integers(bucket.sizes[k]);
        state.emplace(
            bucket.names[k] + suffix,
            on_host.narrow(0, bucket.shard->members[k].offset, elements).view(bucket.sizes[k]));
      }
    }
    if (!keep) continue;
    const at::Tensor steps = update_.step_count().to(at::kCPU);
    for (const std::string& name : bucket.names) state.emplace(name + ".step", steps);
  }
  return state;
}

void ShardedAdamW::load_state(const OptimizerState& saved, const std::string& source) {
  at::NoGradGuard no_grad;
  // Everything is checked before anything changes.
  for (const BucketState& bucket : buckets_) {
    for (size_t k = 0; k < bucket.names.size(); ++k) {
      for (const char* suffix : {".exp_avg", ".exp_avg_sq"})
        saved_entry(saved, bucket.names[k] + suffix, bucket.sizes[k], source);
      saved_entry(saved, bucket.names[k] + ".step", {}, source);
    }
  }
  for (BucketState& bucket : buckets_) {
    for (auto& [suffix, part] :
         {std::pair{".exp_avg", bucket.exp_avg}, std::pair{".exp_avg_sq", bucket.exp_avg_sq}}) {
      const at::Tensor whole =
          at::zeros({bucket.shard->bucket.numel()}, part.options().device(at::kCPU));
      for (size_t k = 0; k < bucket.names.size(); ++k) {
        const at::Tensor& value = saved.at(bucket.names[k] + suffix);
        whole.narrow(0, bucket.shard->members[k].offset, value.numel()).copy_(value.flatten());
      }
      at::Tensor(part).copy_(whole.narrow(0, bucket.shard->begin, bucket.shard->elements));
    }
  }
  // Every parameter takes every step, so any one count is the count.
  if (!buckets_.empty()) {
    at::Tensor(update_.step_count()).copy_(saved.at(buckets_.front().names.front() + ".step"));
  }
}

int64_t ShardedAdamW::state_bytes() const {
  size_t bytes = update_.step_count().nbytes();
  for (const BucketState& bucket : buckets_)
    bytes += bucket.exp_avg.nbytes() + bucket.exp_avg_sq.nbytes();
  return static_cast<int64_t>(bytes);
}

}  // namespace mltrain
