#include "model/interop/weight_files.h"

#include <fmt/format.h>

#include "common/error.h"

namespace mltrain {

WeightFiles::WeightFiles(const std::filesystem::path& file) : source_(file.string()) {
  files_.push_back(std::make_unique<SafetensorsReader>(file));
  for (const SafetensorsEntry& entry : files_.back()->entries()) {
    entries_.emplace(entry.name, entry);
    file_of_.emplace(entry.name, files_.back().get());
  }
}

WeightFiles::WeightFiles(
    const std::vector<std::pair<std::filesystem::path, std::vector<std::string>>>& files,
    std::string source)
    : source_(std::move(source)) {
  for (const auto& [path, names] : files) {
    files_.push_back(std::make_unique<SafetensorsReader>(path));
    for (const std::string& name : names) {
      const SafetensorsEntry* entry = files_.back()->find(name);
      if (entry == nullptr) {
        throw UserError(
            fmt::format("{}: no tensor {}, which {} puts there", path.string(), name, source_));
      }
      entries_.emplace(name, *entry);
      file_of_.emplace(name, files_.back().get());
    }
  }
}

void WeightFiles::read_into(const std::string& name, const at::Tensor& destination) const {
  file_of_.at(name)->read_pieces({{.name = name, .first = 0, .values = destination}});
}

}  // namespace mltrain
