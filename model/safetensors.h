#pragma once

#include <ATen/Tensor.h>

#include <filesystem>
#include <map>
#include <string>

namespace mltrain {

using NamedTensors = std::map<std::string, at::Tensor>;

// The .safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the tensors' raw little-endian bytes, packed with no gaps.

// Writes the tensors (copied to the CPU, contiguous) atomically: a reader never sees a partial
// file.
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor into CPU memory. Validates the header length, the JSON, each dtype, shape and
// offset range, and that the data section is exactly covered; a failure is a UserError naming the
// file and, where one is at fault, the tensor.
NamedTensors load_safetensors(const std::filesystem::path& path);

}  // namespace mltrain
