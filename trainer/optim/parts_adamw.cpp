#include "trainer/optim/parts_adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>

namespace mltrain {

PartsAdamW::PartsAdamW(const NamedParameters& parameters, std::vector<BucketLayout> buckets,
                       std::vector<Part> parts, Communicator& communicator, AdamWOptions options)
    : named_(parameters),
      buckets_(std::move(buckets)),
      parts_(std::move(parts)),
      communicator_(communicator),
      update_(options,
              parameters.empty() ? c10::Device(c10::kCPU) : parameters.front().tensor.device()) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Part& part = parts_.at(b);
    part.exp_avg = at::zeros_like(part.weights);
    part.exp_avg_sq = at::zeros_like(part.weights);
    add_pieces_to_update(buckets_[b], part);
  }
  update_.set_grads(/*decay=*/true, decayed_grads_);
  update_.set_grads(/*decay=*/false, other_grads_);
}

// Cuts the part at its parameters' edges into pieces, and adds each to AdamW's group of its
// parameter: decayed or not.
void PartsAdamW::add_pieces_to_update(const BucketLayout& bucket, const Part& part) {
  const int64_t begin = part.begin;
  const int64_t end = part.begin + part.weights.numel();
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const at::Tensor& parameter = named_[bucket.members[k]].tensor;
    // The piece of the parameter within this rank's part, in the part's coordinates.
    const int64_t first = std::max(bucket.offsets[k], begin);
    const int64_t last = std::min(bucket.offsets[k] + parameter.numel(), end);
    if (first >= last) continue;
    const auto piece = [&](const at::Tensor& values) {
      return values.narrow(0, first - begin, last - first);
    };
    update_.add(piece(part.weights), piece(part.exp_avg), piece(part.exp_avg_sq),
                decays(parameter));
    (decays(parameter) ? decayed_grads_ : other_grads_).push_back(piece(part.gradients));
  }
}

OptimizerState PartsAdamW::state() const {
  at::NoGradGuard no_grad;
  const bool keep = communicator_.run_rank() == 0;
  OptimizerState state;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const BucketLayout& bucket = buckets_[b];
    const Part& part = parts_[b];
    for (const auto& [suffix, moment] :
         {std::pair{".exp_avg", part.exp_avg}, std::pair{".exp_avg_sq", part.exp_avg_sq}}) {
      const at::Tensor whole = at::zeros({bucket.elements}, moment.options());
      whole.narrow(0, part.begin, moment.numel()).copy_(moment);
      communicator_.all_gather(whole)->wait();
      if (!keep) continue;
      const at::Tensor on_host = whole.to(at::kCPU);
      for (size_t k = 0; k < bucket.members.size(); ++k) {
        add_by_part(state, member(b, k),
                    bucket.member_view(on_host, k, member(b, k).tensor.sizes()), suffix);
      }
    }
    if (!keep) continue;
    const at::Tensor steps = update_.step_count().to(at::kCPU);
    for (size_t k = 0; k < bucket.members.size(); ++k) {
      for (const ParameterPart& parameter_part : member(b, k).parts)
        state.emplace(parameter_part.name + ".step", steps);
    }
  }
  return state;
}

void PartsAdamW::load_state(const OptimizerState& saved, const std::string& source) {
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
    const BucketLayout& bucket = buckets_[b];
    Part& part = parts_[b];
    for (auto& [suffix, moment] :
         {std::pair{".exp_avg", part.exp_avg}, std::pair{".exp_avg_sq", part.exp_avg_sq}}) {
      const at::Tensor whole = at::zeros({bucket.elements}, moment.options().device(at::kCPU));
      for (size_t k = 0; k < bucket.members.size(); ++k) {
        const NamedParameter& parameter = member(b, k);
        copy_saved_parts(saved, parameter, suffix,
                         bucket.member_view(whole, k, parameter.tensor.sizes()));
      }
      at::Tensor(moment).copy_(whole.narrow(0, part.begin, moment.numel()));
    }
  }
  if (!first_step.empty()) at::Tensor(update_.step_count()).copy_(saved.at(first_step));
}

int64_t PartsAdamW::state_bytes() const {
  size_t bytes = update_.step_count().nbytes();
  for (const Part& part : parts_) bytes += part.exp_avg.nbytes() + part.exp_avg_sq.nbytes();
  return static_cast<int64_t>(bytes);
}

}  // namespace mltrain
