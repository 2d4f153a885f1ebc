#include "data/corpus_description.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"

namespace mltrain {

void write_corpus_description(const std::filesystem::path& directory,
                              const CorpusDescription& description) {
  nlohmann::json json = {{"format", description.chat_template ? "chat" : "tokens"},
                         {"loss_masks", description.loss_masks}};
  if (description.chat_template)
    json["chat_template"] = chat_template_name(*description.chat_template);
  write_file_atomically(directory / kCorpusDescriptionFile, json.dump(2) + "\n");
}

CorpusDescription read_corpus_description(const std::filesystem::path& directory) {
  const std::filesystem::path path = directory / kCorpusDescriptionFile;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return {};
  const std::string text = read_text_file(path, "corpus description");
  const auto fail = [&](const std::string& what) {
    return UserError(
        fmt::format("{}: not a corpus description that mlprep writes ({})", path.string(), what));
  };
  CorpusDescription description;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    description.loss_masks = json.at("loss_masks").get<bool>();
    if (json.contains("chat_template")) {
      const std::string name = json.at("chat_template").get<std::string>();
      description.chat_template = chat_template_named(name);
      if (!description.chat_template) throw fail(fmt::format("unknown chat template {}", name));
    }
  } catch (const nlohmann::json::exception& bad) {
    throw fail(bad.what());
  }
  return description;
}

}  // namespace mltrain
