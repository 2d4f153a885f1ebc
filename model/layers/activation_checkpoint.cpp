#include "model/layers/activation_checkpoint.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <utility>

#include "model/kernels/autocast_region.h"

namespace mltrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using TensorFunction = std::function<at::Tensor(const at::Tensor&)>;

// The states of the generators that random ops on a device draw from: the CPU default generator,
// and the device's own default generator when it is another. ATen's device hooks reach a CUDA
// device's, so this needs no CUDA headers, and a CPU device never touches CUDA.
class GeneratorStates {
 public:
  explicit GeneratorStates(c10::Device device) {
    save(at::globalContext().defaultGenerator(c10::kCPU));
    if (!device.is_cpu()) save(at::globalContext().defaultGenerator(device));
  }

  void restore() const {
    for (auto [generator, state] : states_) {
      const std::lock_guard lock(generator.mutex());
      generator.set_state(state);
    }
  }

 private:
  void save(at::Generator generator) {
    const std::lock_guard lock(generator.mutex());
    at::Tensor state = generator.get_state();
    states_.emplace_back(std::move(generator), std::move(state));
  }

  std::vector<std::pair<at::Generator, at::Tensor>> states_;
};

// The forward pass's generator states for the recomputation, so that it draws the numbers the
// forward pass drew; when it ends, the generators go back to where they were, so that the
// recomputation leaves the global random stream as it found it.
class ReplayedRandomness {
 public:
  ReplayedRandomness(const GeneratorStates& forward, c10::Device device) : current_(device) {
    forward.restore();
  }
  ~ReplayedRandomness() { current_.restore(); }
  ReplayedRandomness(const ReplayedRandomness&) = delete;
  ReplayedRandomness& operator=(const ReplayedRandomness&) = delete;

 private:
  GeneratorStates current_;
};

// What backward needs besides the saved tensors: the function and what it ran under. Kept in the
// node's saved_data as a capsule, the one kind of IValue that holds an arbitrary C++ object.
struct ForwardPass : torch::CustomClassHolder {
  ForwardPass(TensorFunction fn, c10::Device device)
      : fn(std::move(fn)),
        device(device),
        autocast(AutocastSettings::now(device.type())),
        generators(device) {}

  TensorFunction fn;
  c10::Device device;
  AutocastSettings autocast;
  GeneratorStates generators;
};

constexpr char kForwardPassKey[] = "forward_pass";

// fn(input) with a graph, under the forward pass's autocast settings and generator states.
at::Tensor recompute(const ForwardPass& pass, const at::Tensor& input) {
  const ReplayedRandomness randomness(pass.generators, pass.device);
  const AutocastRegion autocast(pass.autocast);
  const at::AutoGradMode grad_mode(true);
  return pass.fn(input);
}

// The node's inputs are fn (no gradient), input and the parameters, in that order; its edges, which
// needs_input_grad counts, are those of the tensors: input, then the parameters.
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const TensorFunction& fn, const at::Tensor& input,
                            at::TensorList parameters) {
    // Taken before fn draws any random numbers.
    auto pass = c10::make_intrusive<ForwardPass>(fn, input.device());
    variable_list saved{input};
    saved.insert(saved.end(), parameters.begin(), parameters.end());
    ctx->save_for_backward(std::move(saved));
    ctx->saved_data[kForwardPassKey] = at::IValue::make_capsule(std::move(pass));
    ctx->set_materialize_grads(false);
    return fn(input);  // without a graph: Function::apply runs forward under no-grad
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    variable_list input_grads(1 + saved.size());
    if (!grads[0].defined()) return input_grads;  // nothing flows back through the output

    at::Tensor input = saved[0].detach();
    input.requires_grad_(ctx->needs_input_grad(0));
    std::vector<size_t> wanted;  // indices into saved
    variable_list with_respect_to;
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!ctx->needs_input_grad(i)) continue;
      wanted.push_back(i);
      with_respect_to.push_back(i == 0 ? input : saved[i]);
    }
    if (wanted.empty()) return input_grads;

    const auto pass = c10::static_intrusive_pointer_cast<ForwardPass>(
        ctx->saved_data.at(kForwardPassKey).toCapsule());
    const at::Tensor output = recompute(*pass, input);
    if (!output.requires_grad()) return input_grads;  // fn ignores what needs a gradient
    // Outside the autocast region, as the backward of the plain graph runs. autograd::grad returns
    // the parameters' gradients rather than accumulating them (but for those a fused projection
    // adds straight into .grad, linear.h, returned undefined): the outer graph accumulates them
    // and runs each parameter's AccumulateGrad and its hooks, once.
    const variable_list computed =
        torch::autograd::grad({output}, with_respect_to, {grads[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wanted.size(); ++k) input_grads[1 + wanted[k]] = computed[k];
    return input_grads;
  }
};

}  // namespace

at::Tensor checkpointed(const std::function<at::Tensor(const at::Tensor&)>& fn,
                        const at::Tensor& input, const std::vector<at::Tensor>& parameters) {
  return CheckpointFunction::apply(fn, input, at::TensorList(parameters));
}

}  // namespace mltrain
