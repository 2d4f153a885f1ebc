#include "data/corpus_prep.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"
#include "data/bpe_encoder.h"
#include "data/conversation.h"
#include "data/corpus_description.h"
#include "data/corpus_output.h"
#include "data/document_hash.h"
#include "data/ordered_pipeline.h"
#include "data/progress.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data/tokenizer_sample.h"

namespace mltrain {
namespace {

// Documents travel to the encoders in batches of about this much text: enough to keep a thread
// busy for a few milliseconds, small enough that the batches in flight hold little memory.
constexpr int64_t kBatchTextBytes = int64_t{1} << 20;

// The loss mask's flag of the end-of-document token after a conversation: the next document is
// not the answer's to predict.
constexpr uint8_t kNotTarget = 0;

// What a run is asked that would fail only after hours: refused before anything is done.
void check_options(const CorpusPrepOptions& options) {
  for (const std::filesystem::path& input : options.inputs) {
    // access(), not an open: opening a named pipe would wait for its writer.
    if (::access(input.c_str(), R_OK) != 0) {
      throw UserError(
          fmt::format("{}: cannot read the input file: {}", input.string(), std::strerror(errno)));
    }
    std::error_code error;
    if (std::filesystem::is_directory(input, error))
      throw UserError(fmt::format("{}: cannot read the input file: a directory", input.string()));
    // A device or a socket is no corpus: /dev/zero, say, is one endless line.
    const auto kind = std::filesystem::status(input, error).type();
    if (kind == std::filesystem::file_type::character ||
        kind == std::filesystem::file_type::block || kind == std::filesystem::file_type::socket) {
      throw UserError(
          fmt::format("{}: a device or a socket, not a corpus: give files, directories or a pipe",
                      input.string()));
    }
    // Training a tokenizer reads the inputs twice, and a pipe gives its bytes once.
    if (!std::filesystem::is_regular_file(input, error) && options.tokenizer.empty()) {
      throw UserError(fmt::format(
          "{}: not a regular file (a pipe?): mlprep reads it twice when it trains the tokenizer; "
          "give one with --tokenizer, or write the input to a file",
          input.string()));
    }
  }
  if (options.shard_tokens < 1 || options.shard_tokens > kMaxShardTokens) {
    throw UserError(fmt::format("--shard-tokens {}: a shard holds 1 to {} tokens",
                                options.shard_tokens, kMaxShardTokens));
  }
  if (options.threads < 1)
    throw UserError(fmt::format("--threads {}: at least 1", options.threads));
}

// The tokenizer in `directory`: trained on a sample of the inputs, or copied from the one given.
std::filesystem::path make_tokenizer(const CorpusPrepOptions& options,
                                     const std::filesystem::path& directory) {
  std::filesystem::path model = directory / "tokenizer.model";
  if (!options.tokenizer.empty()) {
    // Loaded first, so that a file that is no tokenizer fails clearly; written as loaded, so that
    // the file is read once.
    const Tokenizer given(options.tokenizer);
    write_file_atomically(model, given.serialized());
    return model;
  }
  auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<std::string> sample = tokenizer_sample(
      options.inputs, options.reader, options.tokenizer_sample_mb * 1'000'000, options.seed);
  const bool chat = options.reader.format == DocumentFormat::kChat;
  // A conversation's document is its JSON; the tokenizer learns the text the template renders.
  if (chat) {
    for (std::string& document : sample)
      document = chat_training_text(parse_conversation(document), options.chat_template);
  }
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
      sample.size(), sample_bytes / 1e6, seconds(), options.vocab_size, options.threads);
  start = std::chrono::steady_clock::now();
  train_tokenizer(sample, options.vocab_size, options.threads, model,
                  chat ? chat_control_pieces(options.chat_template) : std::vector<std::string>{});
  spdlog::info("tokenizer trained in {:.1f} s", seconds());
  return model;
}

// Documents on their way from the reader through an encoder to the shard writers.
struct Batch {
  std::vector<std::string> documents;
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<std::vector<uint8_t>> targets;  // a chat corpus's loss masks
  int64_t bytes_read = 0;                     // the reader's count once the batch was full
};

// One split's shards and counts.
struct SplitWriter {
  ShardSeriesWriter shards;
  int64_t documents = 0;
};

void log_summary(const CorpusPrepReport& report, double seconds, double val_fraction) {
  const int64_t tokens = report.train_tokens + report.val_tokens;
  spdlog::info("encoded {} documents, {:.1f} MB, in {:.1f} s: {:.2f} bytes per token",
               report.train_documents + report.val_documents, report.text_bytes / 1e6, seconds,
               static_cast<double>(report.text_bytes) / tokens);
  spdlog::info(
      "train: {} tokens, {} documents, {} shard(s); val: {} tokens, {} documents, {} shard(s)",
      report.train_tokens, report.train_documents, report.train_shards, report.val_tokens,
      report.val_documents, report.val_shards);
  if (report.target_tokens > 0) {
    spdlog::info("loss masks: {} of the tokens ({:.1f}%) are targets (the assistants' answers)",
                 report.target_tokens, 100.0 * report.target_tokens / tokens);
  }
  spdlog::info(
      "unknown tokens: {} ({:.4f}% of all){}", report.unknown_tokens,
      100.0 * report.unknown_tokens / tokens,
      report.bad_lines > 0 ? fmt::format("; bad lines passed over: {}", report.bad_lines) : "");
  if (val_fraction > 0 && report.val_documents == 0) {
    spdlog::warn(
        "no document fell in the validation split (--val-fraction {}): mltrain needs val "
        "shards; give a larger fraction",
        val_fraction);
  }
}

}  // namespace

bool is_validation_document(std::string_view text, uint64_t seed, double fraction) {
  // The top 53 bits as a double in [0, 1).
  return static_cast<double>(document_hash(text, seed) >> 11) * 0x1p-53 < fraction;
}

CorpusPrepReport prepare_corpus(const CorpusPrepOptions& options) {
  check_options(options);
  CorpusOutput output(options.out_dir, options.overwrite);
  const std::filesystem::path& directory = output.write_directory();
  const Tokenizer tokenizer(make_tokenizer(options, directory));
  // Shards hold ids below the tokenizer's own vocabulary size.
  const int64_t vocab_size = tokenizer.vocab_size();
  const uint32_t end_of_document = tokenizer.end_of_document();
  const int64_t unknown = tokenizer.unknown();
  const std::optional<BpeEncoder> fast_encoder = BpeEncoder::for_model(tokenizer);
  const ChatRenderer::Encode encode_text = [&](std::string_view text) {
    return fast_encoder ? fast_encoder->encode(text) : tokenizer.encode(text);
  };
  const bool chat = options.reader.format == DocumentFormat::kChat;
  // Made before any encoding: a tokenizer given without the template's markers fails here.
  const std::optional<ChatRenderer> renderer =
      chat ? std::optional<ChatRenderer>(std::in_place, tokenizer, options.chat_template,
                                         encode_text)
           : std::nullopt;
  spdlog::info("encoding with {}",
               fast_encoder ? "mltrain's BPE encoder (SentencePiece's ids)"
                            : "SentencePiece (a model mltrain's encoder does not reproduce)");

  DocumentReader reader(options.inputs, options.reader);
  SplitWriter train{ShardSeriesWriter(directory, "train", vocab_size, options.shard_tokens,
                                      /*with_loss_masks=*/chat)};
  SplitWriter val{ShardSeriesWriter(directory, "val", vocab_size, options.shard_tokens,
                                    /*with_loss_masks=*/chat)};
  CorpusPrepReport report;
  ProgressLog progress("encoding", total_input_bytes(options.inputs));

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
    for (const std::string& document : batch.documents) {
      if (!renderer) {
        batch.tokens.push_back(encode_text(document));
        continue;
      }
      MaskedTokens rendered = renderer->render(parse_conversation(document));
      batch.tokens.push_back(std::move(rendered.tokens));
      batch.targets.push_back(std::move(rendered.targets));
    }
  };
  const std::function<void(Batch&)> write = [&](Batch& batch) {
    for (size_t i = 0; i < batch.documents.size(); ++i) {
      SplitWriter& split =
          is_validation_document(batch.documents[i], options.seed, options.val_fraction) ? val
                                                                                         : train;
      const std::vector<uint32_t>& tokens = batch.tokens[i];
      // llama2's conversations end with </s> already, the end-of-document token.
      const bool ended = chat && !tokens.empty() && tokens.back() == end_of_document;
      if (chat) {
        split.shards.append(tokens, batch.targets[i]);
        if (!ended) split.shards.append({&end_of_document, 1}, {&kNotTarget, 1});
        report.target_tokens += std::count(batch.targets[i].begin(), batch.targets[i].end(), 1);
      } else {
        split.shards.append(tokens);
        split.shards.append({&end_of_document, 1});
      }
      ++split.documents;
      report.text_bytes += static_cast<int64_t>(batch.documents[i].size());
      if (unknown >= 0)
        report.unknown_tokens += std::count(batch.tokens[i].begin(), batch.tokens[i].end(),
                                            static_cast<uint32_t>(unknown));
    }
    if (progress.due()) {
      progress.log(batch.bytes_read,
                   fmt::format(", {} documents, {} tokens", train.documents + val.documents,
                               train.shards.num_tokens() + val.shards.num_tokens()));
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
  if (chat) {
    write_corpus_description(directory,
                             {.chat_template = options.chat_template, .loss_masks = true});
  }
  output.publish();
  log_summary(report, progress.seconds(), options.val_fraction);
  return report;
}

}  // namespace mltrain
