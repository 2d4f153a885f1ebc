#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mltrain {

// A tensor that a parameter holds under a name of its own: rows [first_row, first_row + rows) of
// it. A fused projection holds several (Hugging Face's q, k and v projections in one parameter);
// every other parameter holds one, the whole of itself.
struct ParameterPart {
  std::string name;
  int64_t first_row = 0;
  int64_t rows = 0;
};

// A parameter of the model under its name, with the named tensors it holds. An optimizer updates
// the parameter whole and names its state by the parts, so that checkpoints name what they hold
// whether or not the model fuses it.
struct NamedParameter {
  std::string name;
  at::Tensor tensor;
  std::vector<ParameterPart> parts;
};
using NamedParameters = std::vector<NamedParameter>;

// A parameter that holds only itself, under its own name.
inline NamedParameter unfused_parameter(std::string name, at::Tensor tensor) {
  ParameterPart whole{.name = name, .first_row = 0, .rows = tensor.size(0)};
  return {.name = std::move(name), .tensor = std::move(tensor), .parts = {std::move(whole)}};
}

// The rows of `whole` (the parameter, or a tensor of its shape) that `part` names: a view.
inline at::Tensor part_of(const at::Tensor& whole, const ParameterPart& part) {
  return whole.narrow(0, part.first_row, part.rows);
}

}  // namespace mltrain
