#pragma once

#include <ATen/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/interop/safetensors.h"

namespace mltrain {

// Named tensors in one or more safetensors files: every header read and checked on opening, the
// data a tensor at a time when asked, so that a model loaded in pieces (ZeRO-3's set-up, unit by
// unit) never holds the whole of it.
class WeightFiles {
 public:
  // One file (a checkpoint's model.safetensors), which errors name.
  explicit WeightFiles(const std::filesystem::path& file);
  // Files and the tensors that each holds of those the model reads (a Hugging Face index's
  // weight_map): a tensor missing from its file is a UserError naming the file. Errors name
  // `source` (the index).
  WeightFiles(const std::vector<std::pair<std::filesystem::path, std::vector<std::string>>>& files,
              std::string source);

  const std::string& source() const { return source_; }
  // Every tensor's entry, by name.
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  // Tensor `name` into `destination` (of its shape, any dtype, on any device; cast and copied
  // there).
  void read_into(const std::string& name, const at::Tensor& destination) const;

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, const SafetensorsReader*> file_of_;
};

}  // namespace mltrain
