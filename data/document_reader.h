#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/line_reader.h"

namespace mltrain {

// How input files hold documents.
enum class DocumentFormat {
  kText,     // plain text; blank lines separate documents (a file without one is one document)
  kJsonl,    // one JSON object per line, the document in one string field ("text" by default)
  kFortune,  // fortune files: a line holding only "%" separates documents; terminal colour
             // escapes are removed
  kChat,     // one conversation per JSON line (conversation.h), each a document as
             // conversation_document gives it
};

// "text", "jsonl", "fortune" or "chat"; anything else is a UserError.
DocumentFormat parse_document_format(const std::string& name);

struct DocumentReaderOptions {
  DocumentFormat format = DocumentFormat::kText;
  std::string text_field = "text";  // jsonl
  // A bad jsonl or chat line is counted and passed over instead of ending the run with its file
  // and line.
  bool skip_bad_lines = false;
};

// The documents of the input files, one at a time and in order, holding one file's current
// document in memory at most. A file may be gzip or zstd compressed (LineReader). Documents never
// span files; empty ones are dropped. An unreadable file, damaged compressed data or a bad jsonl or
// chat line (named by file and line) is a UserError.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::filesystem::path> inputs, DocumentReaderOptions options);

  // The next document; none after the last one.
  std::optional<std::string> next();

  // Bytes of the input files read so far (compressed, where they are), and the bad lines passed
  // over (skip_bad_lines).
  int64_t bytes_read() const { return finished_files_bytes_ + (file_ ? file_->consumed() : 0); }
  int64_t bad_lines() const { return bad_lines_; }

 private:
  bool next_line(std::string& line);
  bool open_next_file();
  std::optional<std::string> document_of_json_line(const std::string& line);
  // A UserError naming the file and line, or, with skip_bad_lines, a count (and a warning, once).
  void pass_over_bad_line(const std::string& what);

  std::vector<std::filesystem::path> inputs_;
  DocumentReaderOptions options_;
  size_t next_input_ = 0;
  std::unique_ptr<LineReader> file_;  // the file being read, if any
  int64_t line_number_ = 0;
  int64_t finished_files_bytes_ = 0;
  int64_t bad_lines_ = 0;
};

// All the documents of the inputs (DocumentReader), for corpora that fit in memory.
std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& inputs,
                                        const DocumentReaderOptions& options);
inline std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& inputs,
                                               DocumentFormat format) {
  return read_documents(inputs, DocumentReaderOptions{.format = format});
}

// The files that command-line inputs name, in order: a file as it is, a directory's regular files
// (recursively, sorted by path, hidden ones left out), a glob's matches (sorted; a matching
// directory gives its files). An input that gives no file is a UserError; a missing file is found
// when it is read.
std::vector<std::filesystem::path> list_input_files(const std::vector<std::string>& inputs);

// The input files' total size in bytes, for progress.
int64_t total_input_bytes(const std::vector<std::filesystem::path>& files);

}  // namespace mltrain
