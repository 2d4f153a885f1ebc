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

SafetensorsShare PartsAdamW::share(bool writing) const {
  SafetensorsShare share;
  const at::Tensor& steps = update_.step_count();
  // Every rank holds the same count: rank 0 writes it, and one entry of it is read.
  bool takes_steps = !writing || communicator_.run_rank() == 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Part& part = parts_[b];
    for (size_t k = 0; k < buckets_[b].members.size(); ++k) {
      const NamedParameter& parameter = member(b, k);
      add_part_entries(share.entries, parameter, ".exp_avg", part.exp_avg.scalar_type());
      add_part_entries(share.entries, parameter, ".exp_avg_sq", part.exp_avg_sq.scalar_type());
      for (const ParameterPart& parameter_part : parameter.parts) {
        const std::string name = parameter_part.name + ".step";
        share.entries.push_back({name, steps.scalar_type(), steps.sizes().vec()});
        if (takes_steps) share.pieces.push_back({.name = name, .first = 0, .values = steps});
        takes_steps = takes_steps && writing;
      }
    }
    if (writing && !writes_its_parts(communicator_)) continue;
    for (const auto& [suffix, moment] :
         {std::pair{".exp_avg", part.exp_avg}, std::pair{".exp_avg_sq", part.exp_avg_sq}}) {
      for (TensorPiece& piece : pieces_of_part(named_, buckets_[b], part.begin, moment, suffix))
        share.pieces.push_back(std::move(piece));
    }
  }
  return share;
}

void PartsAdamW::load_own_state(const SafetensorsReader& file, const std::string& source) {
  const SafetensorsShare own = share(/*writing=*/false);
  // Everything is checked before anything changes.
  for (const SafetensorsEntry& expected : own.entries) {
    const SafetensorsEntry* saved = file.find(expected.name);
    if (saved == nullptr || saved->shape != expected.shape)
      throw saved_entry_error(source, expected.name, saved == nullptr);
  }
  file.read_pieces(own.pieces);
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

std::vector<TensorPiece> pieces_of_part(const NamedParameters& parameters,
                                        const BucketLayout& bucket, int64_t begin,
                                        const at::Tensor& values, std::string_view suffix) {
  const int64_t end = begin + values.numel();
  std::vector<TensorPiece> pieces;
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const at::Tensor& parameter = parameters[bucket.members[k]].tensor;
    const int64_t row_elements = parameter.numel() / parameter.size(0);
    for (const ParameterPart& part : parameters[bucket.members[k]].parts) {
      // The named tensor's elements in the bucket, and those of them in this rank's part.
      const int64_t first = bucket.offsets[k] + part.first_row * row_elements;
      const int64_t last = first + part.rows * row_elements;
      const int64_t from = std::max(first, begin);
      const int64_t to = std::min(last, end);
      if (from >= to) continue;
      pieces.push_back({.name = part.name + std::string(suffix),
                        .first = from - first,
                        .values = values.narrow(0, from - begin, to - from)});
    }
  }
  return pieces;
}

void add_part_entries(std::vector<SafetensorsEntry>& entries, const NamedParameter& parameter,
                      std::string_view suffix, at::ScalarType dtype) {
  for (const ParameterPart& part : parameter.parts) {
    // Its shape from the parameter's, not a view of it: a ZeRO-3 unit's freed weights have no
    // bytes to view.
    std::vector<int64_t> shape = parameter.tensor.sizes().vec();
    shape.front() = part.rows;
    entries.push_back({part.name + std::string(suffix), dtype, std::move(shape)});
  }
}

}  // namespace mltrain
