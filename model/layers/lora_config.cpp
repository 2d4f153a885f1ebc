#include "model/layers/lora_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace mltrain {
namespace {

std::vector<std::string> names_in(const std::string& text) {
  std::vector<std::string> names;
  std::istringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    names.push_back(name);
  }
  return names;
}

}  // namespace

std::vector<std::string> LoraConfig::target_list() const {
  const std::vector<std::string> given = names_in(targets);
  std::vector<std::string> list;
  for (const std::string& name : lora_target_names())
    if (std::find(given.begin(), given.end(), name) != given.end()) list.push_back(name);
  return list;
}

bool LoraConfig::adapts(const std::string& name) const {
  const std::vector<std::string> list = target_list();
  return std::find(list.begin(), list.end(), name) != list.end();
}

int64_t LoraConfig::parameters(const ModelConfig& model) const {
  if (!enabled()) return 0;
  const int64_t q = model.n_q_heads * model.head_dim;
  const int64_t kv = model.n_kv_heads * model.head_dim;
  // (columns, rows) of each projection, as lora_target_names() orders them.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {model.d_model, q},          {model.d_model, kv},          {model.d_model, kv},
      {q, model.d_model},          {model.d_model, model.d_ffn}, {model.d_model, model.d_ffn},
      {model.d_ffn, model.d_model}};
  int64_t per_block = 0;
  for (size_t t = 0; t < lora_target_names().size(); ++t) {
    if (adapts(lora_target_names()[t])) per_block += rank * (shapes[t].first + shapes[t].second);
  }
  return per_block * model.n_layers;
}

void LoraConfig::validate() const {
  const std::vector<std::string> given = names_in(targets);
  for (const std::string& name : given) {
    if (std::find(lora_target_names().begin(), lora_target_names().end(), name) ==
        lora_target_names().end()) {
      throw UserError(fmt::format("lora.targets: \"{}\" is not a projection; name some of {}", name,
                                  fmt::join(lora_target_names(), ", ")));
    }
  }
  if (enabled() && target_list().empty()) {
    throw UserError(fmt::format("lora.targets is empty: name some of {}",
                                fmt::join(lora_target_names(), ", ")));
  }
}

}  // namespace mltrain
