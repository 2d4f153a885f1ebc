#include "trainer/report/model_summary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <regex>
#include <vector>

namespace mltrain {
namespace {

struct Row {
  std::string module;
  std::vector<int64_t> shape;
  int64_t copies = 0;
  int64_t count = 0;
};

std::string with_thousands(int64_t value) {
  const std::string digits = std::to_string(value);
  std::string grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

}  // namespace

std::string parameter_table(const Llama& model) {
  static const std::regex layer_index(R"(^layers\.\d+\.)");
  std::vector<Row> rows;
  for (const auto& item : model->named_parameters()) {
    std::string module = std::regex_replace(item.key(), layer_index, "layers.*.");
    module = module.substr(0, module.rfind(".weight"));
    if (module == "token_embeddings" && model->config().tie_word_embeddings) {
      module += " (= lm_head)";
    }
    auto row =
        std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.module == module; });
    if (row == rows.end()) row = rows.insert(rows.end(), Row{module, item.value().sizes().vec()});
    row->copies += 1;
    row->count += item.value().numel();
  }
  std::string table = fmt::format("{:<30} {:>18} {:>12}\n", "module", "shape", "parameters");
  int64_t total = 0;
  for (const Row& row : rows) {
    const std::string shape = fmt::format("[{}]", fmt::join(row.shape, ", "));
    const std::string shapes = row.copies > 1 ? fmt::format("{} x {}", row.copies, shape) : shape;
    table += fmt::format("{:<30} {:>18} {:>12}\n", row.module, shapes, with_thousands(row.count));
    total += row.count;
  }
  table += fmt::format("{:<30} {:>18} {:>12}\n", "total", "", with_thousands(total));
  return table;
}

}  // namespace mltrain
