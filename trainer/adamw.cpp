#include "trainer/adamw.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <cmath>

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

AdamW::AdamW(const NamedParameters& parameters, AdamWOptions options, AdamWKernel kernel)
    : options_(options), kernel_(kernel) {
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

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++steps_;
  for (Group& group : groups_) {
    if (kernel_ == AdamWKernel::kFused) {
      fused_step(group, lr);
    } else {
      foreach_step(group, lr);
    }
  }
}

void AdamW::fused_step(Group& group, double lr) {
  at::_foreach_add_(group.state_steps, 1.0);
  at::_fused_adamw_(group.parameters, grads_of(group.parameters), group.exp_avgs, group.exp_avg_sqs,
                    /*max_exp_avg_sqs=*/{}, group.state_steps, lr, options_.beta1, options_.beta2,
                    group.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
}

void AdamW::foreach_step(Group& group, double lr) {
  at::_foreach_add_(group.state_steps, 1.0);
  const std::vector<at::Tensor> grads = grads_of(group.parameters);
  const double t = static_cast<double>(steps_);
  const double bias1 = 1.0 - std::pow(options_.beta1, t);
  const double bias2 = 1.0 - std::pow(options_.beta2, t);
  if (group.weight_decay != 0.0) at::_foreach_mul_(group.parameters, 1.0 - lr * group.weight_decay);
  at::_foreach_lerp_(group.exp_avgs, grads, 1.0 - options_.beta1);
  at::_foreach_mul_(group.exp_avg_sqs, options_.beta2);
  at::_foreach_addcmul_(group.exp_avg_sqs, grads, grads, 1.0 - options_.beta2);
  // p -= lr / bias1 * m / (sqrt(v) / sqrt(bias2) + eps)
  std::vector<at::Tensor> denominators = at::_foreach_sqrt(group.exp_avg_sqs);
  at::_foreach_div_(denominators, std::sqrt(bias2));
  at::_foreach_add_(denominators, options_.eps);
  at::_foreach_addcdiv_(group.parameters, group.exp_avgs, denominators, -lr / bias1);
}

NamedTensors AdamW::state() const {
  NamedTensors state;
  for (const Group& group : groups_) {
    for (size_t i = 0; i < group.names.size(); ++i) {
      state.emplace(group.names[i] + ".exp_avg", group.exp_avgs[i]);
      state.emplace(group.names[i] + ".exp_avg_sq", group.exp_avg_sqs[i]);
      state.emplace(group.names[i] + ".step", group.state_steps[i]);
    }
  }
  return state;
}

void AdamW::load_state(const NamedTensors& saved, const std::string& source) {
  const NamedTensors own = state();
  for (const auto& [name, tensor] : own) {
    const auto found = saved.find(name);
    if (found == saved.end() || found->second.sizes() != tensor.sizes()) {
      throw UserError(fmt::format("{}: optimizer state {} is {}", source, name,
                                  found == saved.end() ? "missing" : "of another shape"));
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : own) at::Tensor(tensor).copy_(saved.at(name));
  // Every parameter has taken every step: any one count is the optimizer's.
  steps_ = groups_.empty() ? 0 : static_cast<int64_t>(groups_.front().state_steps.front().item<double>());
}

void AdamW::zero_grad() {
  for (Group& group : groups_) {
    for (at::Tensor& parameter : group.parameters) {
      if (parameter.grad().defined()) parameter.mutable_grad() = at::Tensor();
    }
  }
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = grads_of(parameters);
  const at::Tensor norm = at::stack(at::_foreach_norm(grads, 2)).to(at::kFloat).norm();
  const double value = norm.item<double>();
  if (max_norm > 0.0 && value > max_norm) at::_foreach_mul_(grads, max_norm / (value + 1e-6));
  return value;
}

}  // namespace mltrain
