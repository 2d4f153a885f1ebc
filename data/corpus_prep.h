#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_template.h"
#include "data/document_reader.h"

namespace mltrain {

struct CorpusPrepOptions {
  std::vector<std::filesystem::path> inputs;  // files (list_input_files expands the command line)
  std::filesystem::path out_dir;
  DocumentReaderOptions reader;
  ChatTemplate chat_template = ChatTemplate::chatml;  // for DocumentFormat::kChat
  int64_t vocab_size = 4096;
  std::filesystem::path tokenizer;    // an existing model to use; empty: train one
  int64_t tokenizer_sample_mb = 100;  // of 10^6 bytes
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  int threads = 1;
  uint64_t seed = 1337;
  bool overwrite = false;  // replace mlprep's files in a non-empty out_dir instead of refusing it
};

struct CorpusPrepReport {
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t train_shards = 0;
  int64_t val_shards = 0;
  int64_t text_bytes = 0;
  int64_t bad_lines = 0;
  int64_t unknown_tokens = 0;
  int64_t target_tokens = 0;  // a chat corpus's tokens that are training targets (loss masks)
};

// Streams the documents of the inputs through `threads` encoders into out_dir/train_000000.bin...
// and val_000000.bin... (each document followed by the end-of-document token), training
// out_dir/tokenizer.model first on a sample (tokenizer_sample.h) unless one is given. Memory stays
// bounded whatever the corpus's size, the shards are the same bytes for any number of threads, and
// each appears whole or not at all. A non-empty out_dir is a UserError unless options.overwrite
// (corpus_output.h). A chat corpus (DocumentFormat::kChat) renders each conversation with
// options.chat_template and writes a loss mask beside each shard and out_dir/corpus.json
// (corpus_description.h); a tokenizer it trains holds the template's markers as pieces of their
// own, and one given without them is a UserError naming the marker.
CorpusPrepReport prepare_corpus(const CorpusPrepOptions& options);

// Whether a document belongs to the validation split: a seeded hash of its text below
// `fraction`, so that the split holds whatever order or files the documents come in.
bool is_validation_document(std::string_view text, uint64_t seed, double fraction);

}  // namespace mltrain
