#include "data/corpus_prep.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <utility>

#include "common/error.h"
#include "common/file_tree.h"
#include "data/ordered_pipeline.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace mltrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The sample's hashes are salted so that it is not the validation split's lowest hashes.
constexpr uint64_t kSampleSalt = 0x9E3779B97F4A7C15ull;

// Documents travel to the encoders in batches of about this much text: enough to keep a thread
// busy for a few milliseconds, small enough that the batches in flight hold little memory.
constexpr int64_t kBatchTextBytes = int64_t{1} << 20;

// A progress line at most this often.
constexpr double kProgressSeconds = 5.0;

uint64_t document_hash(std::string_view text, uint64_t seed) {
  return XXH3_64bits_withSeed(text.data(), text.size(), seed);
}

bool is_mlprep_output(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  return name == "tokenizer.model" || name.find(".tmp.") != std::string::npos ||
         ((name.starts_with("train_") || name.starts_with("val_")) && name.ends_with(".bin"));
}

// An output directory is new or empty, or with --overwrite loses what mlprep wrote into it before.
void prepare_out_dir(const CorpusPrepOptions& options) {
  std::filesystem::create_directories(options.out_dir);
  std::vector<std::filesystem::path> present;
  for (const auto& entry : std::filesystem::directory_iterator(options.out_dir))
    present.push_back(entry.path());
  if (present.empty()) return;
  if (!options.overwrite) {
    throw UserError(fmt::format(
        "--out {}: the directory is not empty; mlprep writes into a new or empty one (--overwrite "
        "replaces the shards and tokenizer in it)",
        options.out_dir.string()));
  }
  std::error_code same;
  for (const std::filesystem::path& file : present) {
    if (!is_mlprep_output(file)) continue;
    if (!options.tokenizer.empty() && std::filesystem::equivalent(file, options.tokenizer, same))
      continue;  // the tokenizer to use
    remove_tree(file);
  }
}

void log_progress(const char* what, int64_t bytes_read, int64_t total_bytes,
                  Clock::time_point start, const std::string& more) {
  const double seconds = seconds_since(start);
  const double rate = bytes_read / std::max(seconds, 1e-9);
  const std::string eta =
      total_bytes > bytes_read && rate > 0
          ? fmt::format(", ETA {:.0f} s", static_cast<double>(total_bytes - bytes_read) / rate)
          : "";
  spdlog::info("{}: {:.0f}/{:.0f} MB ({:.0f}%), {:.1f} MB/s{}{}", what, bytes_read / 1e6,
               total_bytes / 1e6, 100.0 * bytes_read / std::max<int64_t>(total_bytes, 1),
               rate / 1e6, more, eta);
}

// Trains the tokenizer on a sample unless one is given; the model ends up in out_dir.
std::filesystem::path make_tokenizer(const CorpusPrepOptions& options) {
  const std::filesystem::path model = options.out_dir / "tokenizer.model";
  if (!options.tokenizer.empty()) {
    std::error_code same;
    if (!std::filesystem::equivalent(options.tokenizer, model, same)) {
      const Tokenizer check(options.tokenizer);  // fails clearly before anything is copied
      std::filesystem::copy_file(options.tokenizer, model,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    return model;
  }
  auto start = Clock::now();
  const std::vector<std::string> sample = tokenizer_sample(
      options.inputs, options.reader, options.tokenizer_sample_mb << 20, options.seed);
  if (sample.empty()) {
    throw UserError(fmt::format(
        "no document for the tokenizer to train on: the inputs hold none, or none fits in "
        "--tokenizer-sample-mb {}",
        options.tokenizer_sample_mb));
  }
  int64_t sample_bytes = 0;
  for (const std::string& document : sample) sample_bytes += static_cast<int64_t>(document.size());
  spdlog::info(
      "sampled {} documents, {:.1f} MB, in {:.1f} s; training a {}-token BPE tokenizer "
      "on {} threads...",
      sample.size(), sample_bytes / 1e6, seconds_since(start), options.vocab_size, options.threads);
  start = Clock::now();
  train_tokenizer(sample, options.vocab_size, options.threads, model);
  spdlog::info("tokenizer trained in {:.1f} s: {}", seconds_since(start), model.string());
  return model;
}

// Documents on their way from the reader through an encoder to the shard writers.
struct Batch {
  std::vector<std::string> documents;
  std::vector<std::vector<uint32_t>> tokens;
  int64_t bytes_read = 0;  // the reader's count once the batch was full
};

// One split's shards and counts.
struct SplitWriter {
  ShardSeriesWriter shards;
  int64_t documents = 0;
};

}  // namespace

bool is_validation_document(std::string_view text, uint64_t seed, double fraction) {
  // The top 53 bits as a double in [0, 1).
  return static_cast<double>(document_hash(text, seed) >> 11) * 0x1p-53 < fraction;
}

std::vector<std::string> tokenizer_sample(const std::vector<std::filesystem::path>& inputs,
                                          const DocumentReaderOptions& reader_options,
                                          int64_t max_bytes, uint64_t seed) {
  DocumentReader reader(inputs, reader_options);
  const int64_t total_bytes = total_input_bytes(inputs);
  const auto start = Clock::now();
  auto reported = start;
  // The sample is every document whose hash is below a cutoff, the lowest that leaves it within
  // max_bytes. A max-heap on the hash holds the candidates; a document that leaves it, or arrives
  // at or above the cutoff, lowers the cutoff to its hash or stays out. The cutoff reached is the
  // same for any order of the documents, and so is the sample.
  std::vector<std::pair<uint64_t, std::string>> kept;
  int64_t kept_bytes = 0;
  uint64_t cutoff = UINT64_MAX;
  while (std::optional<std::string> document = reader.next()) {
    const uint64_t hash = document_hash(*document, seed ^ kSampleSalt);
    if (hash >= cutoff) continue;
    kept_bytes += static_cast<int64_t>(document->size());
    kept.emplace_back(hash, std::move(*document));
    std::push_heap(kept.begin(), kept.end());
    while (kept_bytes > max_bytes) {
      std::pop_heap(kept.begin(), kept.end());
      cutoff = kept.back().first;
      kept_bytes -= static_cast<int64_t>(kept.back().second.size());
      kept.pop_back();
    }
    if (seconds_since(reported) > kProgressSeconds) {
      log_progress("sampling for the tokenizer", reader.bytes_read(), total_bytes, start, "");
      reported = Clock::now();
    }
  }
  // Documents of the cutoff's own hash that came before it was reached (copies of one text).
  std::erase_if(kept, [&](const auto& entry) { return entry.first >= cutoff; });
  std::make_heap(kept.begin(), kept.end());
  std::sort_heap(kept.begin(), kept.end());
  std::vector<std::string> sample;
  sample.reserve(kept.size());
  for (auto& [hash, text] : kept) sample.push_back(std::move(text));
  return sample;
}

CorpusPrepReport prepare_corpus(const CorpusPrepOptions& options) {
  // An unreadable input fails the run before anything is written, not hours into it.
  for (const std::filesystem::path& input : options.inputs) {
    if (!std::ifstream(input) || std::filesystem::is_directory(input))
      throw UserError(fmt::format("{}: cannot read the input file", input.string()));
  }
  prepare_out_dir(options);
  const Tokenizer tokenizer(make_tokenizer(options));
  // Shards hold ids below the tokenizer's own vocabulary size.
  const int64_t vocab_size = tokenizer.vocab_size();
  const uint32_t end_of_document = tokenizer.end_of_document();
  const int64_t unknown = tokenizer.unknown();

  DocumentReader reader(options.inputs, options.reader);
  const int64_t total_bytes = total_input_bytes(options.inputs);
  SplitWriter train{ShardSeriesWriter(options.out_dir, "train", vocab_size, options.shard_tokens)};
  SplitWriter val{ShardSeriesWriter(options.out_dir, "val", vocab_size, options.shard_tokens)};
  CorpusPrepReport report;
  const auto start = Clock::now();
  auto reported = start;

  const std::function<std::optional<Batch>()> read_batch = [&]() -> std::optional<Batch> {
    Batch batch;
    int64_t text_bytes = 0;
    while (text_bytes < kBatchTextBytes) {
      std::optional<std::string> document = reader.next();
      if (!document) break;
      text_bytes += static_cast<int64_t>(document->size());
      batch.documents.push_back(std::move(*document));
    }
    if (batch.documents.empty()) return std::nullopt;
    batch.bytes_read = reader.bytes_read();
    return batch;
  };
  const std::function<void(Batch&)> encode = [&](Batch& batch) {
    batch.tokens.reserve(batch.documents.size());
    for (const std::string& document : batch.documents)
      batch.tokens.push_back(tokenizer.encode(document));
  };
  const std::function<void(Batch&)> write = [&](Batch& batch) {
    for (size_t i = 0; i < batch.documents.size(); ++i) {
      SplitWriter& split =
          is_validation_document(batch.documents[i], options.seed, options.val_fraction) ? val
                                                                                         : train;
      split.shards.append(batch.tokens[i]);
      split.shards.append({&end_of_document, 1});
      ++split.documents;
      report.text_bytes += static_cast<int64_t>(batch.documents[i].size());
      if (unknown >= 0)
        report.unknown_tokens += std::count(batch.tokens[i].begin(), batch.tokens[i].end(),
                                            static_cast<uint32_t>(unknown));
    }
    if (seconds_since(reported) > kProgressSeconds) {
      log_progress("encoding", batch.bytes_read, total_bytes, start,
                   fmt::format(", {} documents, {} tokens", train.documents + val.documents,
                               train.shards.num_tokens() + val.shards.num_tokens()));
      reported = Clock::now();
    }
  };
  run_ordered_pipeline<Batch>(read_batch, encode, write, options.threads,
                              /*max_in_flight=*/2 * options.threads + 2);

  report.train_documents = train.documents;
  report.val_documents = val.documents;
  report.train_tokens = train.shards.num_tokens();
  report.val_tokens = val.shards.num_tokens();
  report.train_shards = train.shards.finish();
  report.val_shards = val.shards.finish();
  report.bad_lines = reader.bad_lines();
  if (report.train_documents + report.val_documents < 2) {
    throw UserError(
        fmt::format("the inputs hold {} document(s): at least 2 are needed for a "
                    "training and a validation split",
                    report.train_documents + report.val_documents));
  }
  const int64_t tokens = report.train_tokens + report.val_tokens;
  spdlog::info("encoded {} documents, {:.1f} MB, in {:.1f} s: {:.2f} bytes per token",
               report.train_documents + report.val_documents, report.text_bytes / 1e6,
               seconds_since(start), static_cast<double>(report.text_bytes) / tokens);
  spdlog::info(
      "train: {} tokens, {} documents, {} shard(s); val: {} tokens, {} documents, {} "
      "shard(s)",
      report.train_tokens, report.train_documents, report.train_shards, report.val_tokens,
      report.val_documents, report.val_shards);
  spdlog::info(
      "unknown tokens: {} ({:.4f}% of all){}", report.unknown_tokens,
      100.0 * report.unknown_tokens / tokens,
      report.bad_lines > 0 ? fmt::format("; bad lines passed over: {}", report.bad_lines) : "");
  if (options.val_fraction > 0 && report.val_documents == 0) {
    spdlog::warn(
        "no document fell in the validation split (--val-fraction {}): mltrain needs "
        "val shards; give a larger fraction",
        options.val_fraction);
  }
  return report;
}

}  // namespace mltrain
