#include "data/document_reader.h"

#include <glob.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/error.h"
#include "data/conversation.h"

namespace mltrain {
namespace {

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

bool is_fortune_separator(const std::string& line) { return line == "%" || line == "%\r"; }

// Some fortune files colour their text with terminal escape sequences (ESC [ ... letter), which
// are markup for a terminal, not text to learn.
std::string without_terminal_escapes(const std::string& text) {
  std::string clean;
  clean.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\x1b' && i + 1 < text.size() && text[i + 1] == '[') {
      i += 2;
      while (i < text.size() && !std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
      continue;
    }
    clean += text[i];
  }
  return clean;
}

void append_line(std::string& document, const std::string& line) {
  if (!document.empty()) document += '\n';
  document += line;
}

bool has_glob_characters(const std::string& text) {
  return text.find_first_of("*?[") != std::string::npos;
}

}  // namespace

DocumentFormat parse_document_format(const std::string& name) {
  if (name == "text") return DocumentFormat::kText;
  if (name == "jsonl") return DocumentFormat::kJsonl;
  if (name == "fortune") return DocumentFormat::kFortune;
  if (name == "chat") return DocumentFormat::kChat;
  throw UserError(fmt::format("--format {}: expected text, jsonl, fortune or chat", name));
}

DocumentReader::DocumentReader(std::vector<std::filesystem::path> inputs,
                               DocumentReaderOptions options)
    : inputs_(std::move(inputs)), options_(std::move(options)) {}

std::optional<std::string> DocumentReader::next() {
  std::string document;
  std::string line;
  while (true) {
    if (!file_ && !open_next_file()) return std::nullopt;
    if (!next_line(line)) {  // the end of this file ends its last document
      finished_files_bytes_ += file_->consumed();
      file_.reset();
      if (!document.empty()) return document;
      continue;
    }
    switch (options_.format) {
      case DocumentFormat::kJsonl:
      case DocumentFormat::kChat:
        if (std::optional<std::string> record = document_of_json_line(line)) return record;
        break;
      case DocumentFormat::kText:
        if (!is_blank(line)) {
          append_line(document, line);
        } else if (!document.empty()) {
          return document;
        }
        break;
      case DocumentFormat::kFortune:
        line = without_terminal_escapes(line);
        if (!is_fortune_separator(line)) {
          append_line(document, line);
        } else if (!document.empty()) {
          return document;
        }
        break;
    }
  }
}

bool DocumentReader::open_next_file() {
  if (next_input_ == inputs_.size()) return false;
  file_ = std::make_unique<LineReader>(inputs_[next_input_++]);
  line_number_ = 0;
  return true;
}

bool DocumentReader::next_line(std::string& line) {
  if (!file_->next(line)) return false;
  ++line_number_;
  return true;
}

std::optional<std::string> DocumentReader::document_of_json_line(const std::string& line) {
  if (is_blank(line)) return std::nullopt;
  try {
    if (options_.format == DocumentFormat::kChat)
      return conversation_document(parse_conversation(line));
    std::string text = nlohmann::json::parse(line).at(options_.text_field).get<std::string>();
    if (text.empty()) return std::nullopt;
    return text;
  } catch (const BadConversation& error) {
    pass_over_bad_line(error.what());
  } catch (const nlohmann::json::exception& error) {
    pass_over_bad_line(fmt::format("expected a JSON object with a \"{}\" string ({})",
                                   options_.text_field, error.what()));
  }
  return std::nullopt;
}

void DocumentReader::pass_over_bad_line(const std::string& what) {
  const std::string where =
      fmt::format("{}:{}: {}", inputs_[next_input_ - 1].string(), line_number_, what);
  if (!options_.skip_bad_lines) throw UserError(where + "; --skip-bad-lines passes over them");
  if (bad_lines_++ == 0)
    spdlog::warn("{}; passing over it and any others (--skip-bad-lines)", where);
}

std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& inputs,
                                        const DocumentReaderOptions& options) {
  DocumentReader reader(inputs, options);
  std::vector<std::string> documents;
  while (std::optional<std::string> document = reader.next()) documents.push_back(*document);
  return documents;
}

namespace {

// A path's files into `found`: the path itself, or a directory's regular files below it, hidden
// ones (".git/...") left out.
void add_files(const std::filesystem::path& path, const std::string& input,
               std::vector<std::filesystem::path>& found) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    found.push_back(path);
    return;
  }
  std::filesystem::recursive_directory_iterator entries(path, error);
  for (; !error && entries != std::filesystem::recursive_directory_iterator();
       entries.increment(error)) {
    if (entries->path().filename().string().starts_with(".")) {
      if (entries->is_directory()) entries.disable_recursion_pending();
      continue;
    }
    if (entries->is_regular_file()) found.push_back(entries->path());
  }
  if (error) {
    throw UserError(
        fmt::format("--input {}: cannot list {}: {}", input, path.string(), error.message()));
  }
}

}  // namespace

std::vector<std::filesystem::path> list_input_files(const std::vector<std::string>& inputs) {
  std::vector<std::filesystem::path> files;
  for (const std::string& input : inputs) {
    std::vector<std::filesystem::path> found;
    std::error_code error;
    if (!std::filesystem::exists(input, error) && has_glob_characters(input)) {
      glob_t matches{};
      const int result = ::glob(input.c_str(), 0, nullptr, &matches);
      const std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
      ::globfree(&matches);
      if (result != 0 && result != GLOB_NOMATCH)
        throw UserError(fmt::format("--input {}: the glob could not be read", input));
      for (const std::string& path : paths) add_files(path, input, found);
    } else {
      add_files(input, input, found);
    }
    if (found.empty())
      throw UserError(fmt::format("--input {}: no files in it or matching it", input));
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

int64_t total_input_bytes(const std::vector<std::filesystem::path>& files) {
  int64_t total = 0;
  for (const std::filesystem::path& file : files) {
    std::error_code error;
    const auto size = std::filesystem::file_size(file, error);
    if (!error) total += static_cast<int64_t>(size);
  }
  return total;
}

}  // namespace mltrain
