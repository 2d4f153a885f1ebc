#include "trainer/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "common/error.h"

namespace mltrain {
namespace {

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  grads.reserve(parameters.size());
  for (const at::Tensor& parameter : parameters) grads.push_back(parameter.grad());
  return grads;
}

}  // namespace

AdamWUpdate::AdamWUpdate(AdamWOptions options, c10::Device device)
    : options_(options), step_count_(at::zeros({}, at::TensorOptions(device).dtype(at::kFloat))) {}

void AdamWUpdate::add(const at::Tensor& value, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, bool decay) {
  Group& into = group(decay);
  into.values.push_back(value);
  into.exp_avgs.push_back(exp_avg);
  into.exp_avg_sqs.push_back(exp_avg_sq);
}

void AdamWUpdate::set_grads(bool decay, std::vector<at::Tensor> grads) {
  group(decay).grads = std::move(grads);
}

void AdamWUpdate::step(double lr, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  // The step count advances by 1, or by 0 when skipped.
  step_count_.add_(1.0 - skip);
  for (const bool decay : {true, false}) {
    Group& tensors = group(decay);
    if (tensors.values.empty()) continue;
    // The kernel reads one step count per tensor and never writes them: the one count serves all.
    const std::vector<at::Tensor> step_counts(tensors.values.size(), step_count_);
    // found_inf = 1 makes the kernel return before it touches anything.
    at::_fused_adamw_(tensors.values, tensors.grads, tensors.exp_avgs, tensors.exp_avg_sqs,
                      /*max_exp_avg_sqs=*/{}, step_counts, lr, options_.beta1, options_.beta2,
                      decay ? options_.weight_decay : 0.0, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/skip);
  }
}

AdamW::AdamW(const NamedParameters& parameters, AdamWOptions options)
    : update_(options,
              parameters.empty() ? c10::Device(c10::kCPU) : parameters.front().tensor.device()) {
  for (const NamedParameter& parameter : parameters) {
    Entry entry{parameter, at::zeros_like(parameter.tensor, at::MemoryFormat::Preserve),
                at::zeros_like(parameter.tensor, at::MemoryFormat::Preserve)};
    update_.add(parameter.tensor, entry.exp_avg, entry.exp_avg_sq, decays(parameter.tensor));
    entries_.push_back(std::move(entry));
  }
}

void AdamW::step(double lr, const at::Tensor& skip) {
  // The gradients are read at each step: they are defined (the reducer's views) only once the
  // first backward has run or the reducer is set up.
  for (const bool decay : {true, false}) {
    std::vector<at::Tensor> parameters;
    for (const Entry& entry : entries_) {
      if (decays(entry.parameter.tensor) == decay) parameters.push_back(entry.parameter.tensor);
    }
    update_.set_grads(decay, grads_of(parameters));
  }
  update_.step(lr, skip);
}

OptimizerState AdamW::state() const {
  OptimizerState state;
  for (const Entry& entry : entries_) {
    add_by_part(state, entry.parameter, entry.exp_avg, ".exp_avg");
    add_by_part(state, entry.parameter, entry.exp_avg_sq, ".exp_avg_sq");
    for (const ParameterPart& part : entry.parameter.parts)
      state.emplace(part.name + ".step", update_.step_count());
  }
  return state;
}

void AdamW::load_state(const OptimizerState& saved, const std::string& source) {
  for (const auto& [name, tensor] : state()) saved_entry(saved, name, tensor.sizes(), source);
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : state()) at::Tensor(tensor).copy_(saved.at(name));
}

int64_t AdamW::state_bytes() const {
  size_t bytes = update_.step_count().nbytes();
  for (const Entry& entry : entries_) bytes += entry.exp_avg.nbytes() + entry.exp_avg_sq.nbytes();
  return static_cast<int64_t>(bytes);
}

std::vector<at::Tensor> tensors_of(const NamedParameters& parameters) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(parameters.size());
  for (const NamedParameter& parameter : parameters) tensors.push_back(parameter.tensor);
  return tensors;
}

const at::Tensor& saved_entry(const OptimizerState& saved, const std::string& name,
                              at::IntArrayRef sizes, const std::string& source) {
  const auto found = saved.find(name);
  if (found == saved.end() || found->second.sizes() != sizes)
    throw saved_entry_error(source, name, found == saved.end());
  return found->second;
}

UserError saved_entry_error(const std::string& source, const std::string& name, bool missing) {
  return UserError(fmt::format("{}: optimizer state {} is {}", source, name,
                               missing ? "missing" : "of another shape"));
}

void add_by_part(OptimizerState& state, const NamedParameter& parameter, const at::Tensor& tensor,
                 std::string_view suffix) {
  for (const ParameterPart& part : parameter.parts)
    state.emplace(part.name + std::string(suffix), part_of(tensor, part));
}

void check_saved_parts(const OptimizerState& saved, const NamedParameter& parameter,
                       std::string_view suffix, const std::string& source) {
  for (const ParameterPart& part : parameter.parts) {
    saved_entry(saved, part.name + std::string(suffix), part_of(parameter.tensor, part).sizes(),
                source);
  }
}

void copy_saved_parts(const OptimizerState& saved, const NamedParameter& parameter,
                      std::string_view suffix, const at::Tensor& destination) {
  at::NoGradGuard no_grad;
  for (const ParameterPart& part : parameter.parts)
    part_of(destination, part).copy_(saved.at(part.name + std::string(suffix)));
}

}  // namespace mltrain
