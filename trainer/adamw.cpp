#include "trainer/adamw.h"

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

AdamW::AdamW(const NamedParameters& parameters, AdamWOptions options) : options_(options) {
  Group decayed;
  decayed.weight_decay = options.weight_decay;
  Group not_decayed;
  not_decayed.weight_decay = 0.0;
  for (const auto& [name, parameter] : parameters) {
    Group& group = parameter.dim() >= 2 ? decayed : not_decayed;
    group.names.push_back(name);
    group.parameters.push_back(parameter);
    group.exp_avgs.push_back(at::zeros_like(parameter, at::MemoryFormat::Preserve));
    group.exp_avg_sqs.push_back(at::zeros_like(parameter, at::MemoryFormat::Preserve));
    group.state_steps.push_back(at::zeros({}, parameter.options().dtype(at::kFloat)));
  }
  for (Group* group : {&decayed, &not_decayed}) {
    if (!group->parameters.empty()) groups_.push_back(std::move(*group));
  }
}

void AdamW::step(double lr, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const at::Tensor taken = 1.0 - skip;  // the step counts advance by 1, or by 0 when skipped
  for (Group& group : groups_) {
    at::_foreach_add_(group.state_steps, taken);
    // found_inf = 1 makes the kernel return before it touches anything.
    at::_fused_adamw_(group.parameters, grads_of(group.parameters), group.exp_avgs,
                      group.exp_avg_sqs,
                      /*max_exp_avg_sqs=*/{}, group.state_steps, lr, options_.beta1, options_.beta2,
                      group.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, /*found_inf=*/skip);
  }
}

OptimizerState AdamW::state() const {
  OptimizerState state;
  for (const Group& group : groups_) {
    for (size_t i = 0; i < group.names.size(); ++i) {
      state.emplace(group.names[i] + ".exp_avg", group.exp_avgs[i]);
      state.emplace(group.names[i] + ".exp_avg_sq", group.exp_avg_sqs[i]);
      state.emplace(group.names[i] + ".step", group.state_steps[i]);
    }
  }
  return state;
}

void AdamW::load_state(const OptimizerState& saved, const std::string& source) {
  const OptimizerState own = state();
  for (const auto& [name, tensor] : own) {
    const auto found = saved.find(name);
    if (found == saved.end() || found->second.sizes() != tensor.sizes()) {
      throw UserError(fmt::format("{}: optimizer state {} is {}", source, name,
                                  found == saved.end() ? "missing" : "of another shape"));
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : own) at::Tensor(tensor).copy_(saved.at(name));
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = grads_of(parameters);
  const at::Tensor norm = at::stack(at::_foreach_norm(grads, 2)).to(at::kFloat).norm();
  // The scale in double, then float: the value a host-side max_norm / (norm + 1e-6) would give.
  if (max_norm > 0.0) {
    at::_foreach_mul_(grads,
                      (max_norm / (norm.to(at::kDouble) + 1e-6)).clamp_max(1.0).to(at::kFloat));
  }
  return norm;
}

}  // namespace mltrain
