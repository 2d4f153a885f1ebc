#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mltrain {

// How input files hold documents.
enum class DocumentFormat {
  kText,     // plain text; blank lines separate documents (a file without one is one document)
  kJsonl,    // one JSON object per line with a "text" field
  kFortune,  // fortune files: a line holding only "%" separates documents; terminal colour
             // escapes are removed
};

// "text", "jsonl" or "fortune"; anything else is a UserError.
DocumentFormat parse_document_format(const std::string& name);

// The documents of the files, in order. An unreadable file or a bad JSONL line (named by file and
// line) is a UserError; empty documents are dropped.
std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& inputs,
                                        DocumentFormat format);

struct CorpusPrepOptions {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out_dir;
  DocumentFormat format = DocumentFormat::kText;
  int64_t vocab_size = 4096;
  std::filesystem::path tokenizer;  // an existing model to use; empty: train one
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  int threads = 1;
  uint64_t seed = 1337;
};

struct CorpusPrepReport {
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t text_bytes = 0;
};

// Tokenizes the documents (training a tokenizer first unless one is given) and writes into out_dir
// train_000000.bin..., val_000000.bin... (each document followed by the end-of-document token)
// and tokenizer.model. The validation split is round(val_fraction x documents) documents chosen
// by a seeded shuffle; the rest keep their order.
CorpusPrepReport prepare_corpus(const CorpusPrepOptions& options);

}  // namespace mltrain
