#pragma once

#include <string>

#include "model/layers/llama.h"

namespace mltrain {

// A table of the model's parameters, one row per kind of module: the blocks' modules are folded
// into one row each ("layers.*.attn.wo", 12 x [512, 512]), then the total.
std::string parameter_table(const Llama& model);

}  // namespace mltrain
