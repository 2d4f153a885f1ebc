#include "data/corpus_prep.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "data/shard.h"
#include "data/split_mix.h"
#include "data/tokenizer.h"

namespace mltrain {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path)) {
    throw UserError(fmt::format("{}: cannot read the input file", path.string()));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

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

// Splits text at lines that `is_separator` accepts; the separators themselves are dropped.
template <class Separator>
void split_at_lines(const std::string& text, Separator is_separator,
                    std::vector<std::string>& out) {
  std::string document;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (is_separator(line)) {
      if (!document.empty()) out.push_back(std::move(document));
      document.clear();
    } else {
      document += document.empty() ? line : "\n" + line;
    }
  }
  if (!document.empty()) out.push_back(std::move(document));
}

void read_jsonl(const std::filesystem::path& path, const std::string& text,
                std::vector<std::string>& out) {
  std::istringstream lines(text);
  int64_t number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const auto record = nlohmann::json::parse(line);
      const std::string document = record.at("text").get<std::string>();
      if (!document.empty()) out.push_back(document);
    } catch (const nlohmann::json::exception& error) {
      throw UserError(fmt::format("{}:{}: expected a JSON object with a \"text\" string ({})",
                                  path.string(), number, error.what()));
    }
  }
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Encodes every document on `threads` threads, logging progress from the calling one.
std::vector<std::vector<uint32_t>> encode_documents(const Tokenizer& tokenizer,
                                                    const std::vector<std::string>& documents,
                                                    int threads) {
  std::vector<std::vector<uint32_t>> encoded(documents.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      try {
        for (size_t i = next++; i < documents.size(); i = next++) {
          encoded[i] = tokenizer.encode(documents[i]);
          ++done;
        }
      } catch (...) {
        std::lock_guard lock(error_mutex);
        error = std::current_exception();
        next = documents.size();
      }
    });
  }
  const auto start = Clock::now();
  size_t reported = 0;
  while (done < documents.size() && !error) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const size_t finished = done;
    if (seconds_since(start) > 2 &&
        finished * 10 / documents.size() > reported * 10 / documents.size()) {
      const double rate = finished / seconds_since(start);
      spdlog::info("encoding: {}/{} documents, ETA {:.0f} s", finished, documents.size(),
                   (documents.size() - finished) / rate);
      reported = finished;
    }
  }
  for (std::thread& worker : workers) worker.join();
  if (error) std::rethrow_exception(error);
  return encoded;
}

// Writes the documents' tokens, each followed by end_of_document, as shards prefix_000000.bin...
int64_t write_split(const std::vector<std::vector<uint32_t>>& encoded,
                    const std::vector<size_t>& documents, uint32_t end_of_document,
                    const CorpusPrepOptions& options, const std::string& prefix) {
  std::vector<uint32_t> shard;
  int64_t total = 0;
  int shard_index = 0;
  const auto flush = [&] {
    write_shard(options.out_dir / fmt::format("{}_{:06d}.bin", prefix, shard_index++), shard,
                options.vocab_size);
    total += static_cast<int64_t>(shard.size());
    shard.clear();
  };
  for (const size_t document : documents) {
    const std::vector<uint32_t>& tokens = encoded[document];
    shard.insert(shard.end(), tokens.begin(), tokens.end());
    shard.push_back(end_of_document);
    while (static_cast<int64_t>(shard.size()) >= options.shard_tokens) {
      std::vector<uint32_t> rest(shard.begin() + options.shard_tokens, shard.end());
      shard.resize(options.shard_tokens);
      flush();
      shard = std::move(rest);
    }
  }
  if (!shard.empty()) flush();
  return total;
}

}  // namespace

DocumentFormat parse_document_format(const std::string& name) {
  if (name == "text") return DocumentFormat::kText;
  if (name == "jsonl") return DocumentFormat::kJsonl;
  if (name == "fortune") return DocumentFormat::kFortune;
  throw UserError(fmt::format("--format {}: expected text, jsonl or fortune", name));
}

std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& inputs,
                                        DocumentFormat format) {
  std::vector<std::string> documents;
  for (const std::filesystem::path& path : inputs) {
    const std::string text = read_file(path);
    switch (format) {
      case DocumentFormat::kText:
        split_at_lines(
            text,
            [](const std::string& line) {
              return line.find_first_not_of(" \t\r") == std::string::npos;
            },
            documents);
        break;
      case DocumentFormat::kFortune:
        split_at_lines(
            without_terminal_escapes(text),
            [](const std::string& line) { return line == "%" || line == "%\r"; }, documents);
        break;
      case DocumentFormat::kJsonl:
        read_jsonl(path, text, documents);
        break;
    }
  }
  return documents;
}

CorpusPrepReport prepare_corpus(const CorpusPrepOptions& options) {
  auto start = Clock::now();
  const std::vector<std::string> documents = read_documents(options.inputs, options.format);
  if (documents.size() < 2) {
    throw UserError(
        fmt::format("the inputs hold {} document(s): at least 2 are needed for a "
                    "training and a validation split",
                    documents.size()));
  }
  CorpusPrepReport report;
  for (const std::string& document : documents)
    report.text_bytes += static_cast<int64_t>(document.size());
  spdlog::info("read {} documents, {:.1f} MB of text, in {:.1f} s", documents.size(),
               report.text_bytes / 1e6, seconds_since(start));

  std::filesystem::create_directories(options.out_dir);
  const std::filesystem::path model = options.out_dir / "tokenizer.model";
  if (options.tokenizer.empty()) {
    start = Clock::now();
    spdlog::info("training a {}-token BPE tokenizer on {} threads...", options.vocab_size,
                 options.threads);
    train_tokenizer(documents, options.vocab_size, options.threads, model);
    spdlog::info("tokenizer trained in {:.1f} s: {}", seconds_since(start), model.string());
  } else if (std::filesystem::absolute(options.tokenizer) != std::filesystem::absolute(model)) {
    const Tokenizer check(options.tokenizer);  // fails clearly before anything is copied
    std::filesystem::copy_file(options.tokenizer, model,
                               std::filesystem::copy_options::overwrite_existing);
  }
  const Tokenizer tokenizer(model);

  // Validation documents: a seeded choice of round(fraction x n); the rest stay in file order.
  std::vector<size_t> order(documents.size());
  std::iota(order.begin(), order.end(), 0);
  SplitMix64(options.seed).shuffle(order);
  const auto val_count = static_cast<size_t>(std::llround(options.val_fraction * documents.size()));
  std::vector<size_t> val(order.begin(), order.begin() + val_count);
  std::vector<size_t> train(order.begin() + val_count, order.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());

  start = Clock::now();
  const auto encoded = encode_documents(tokenizer, documents, options.threads);
  // Shards hold ids below the tokenizer's own vocabulary size.
  CorpusPrepOptions shard_options = options;
  shard_options.vocab_size = tokenizer.vocab_size();
  report.train_documents = static_cast<int64_t>(train.size());
  report.val_documents = static_cast<int64_t>(val.size());
  report.train_tokens =
      write_split(encoded, train, tokenizer.end_of_document(), shard_options, "train");
  if (!val.empty()) {
    report.val_tokens =
        write_split(encoded, val, tokenizer.end_of_document(), shard_options, "val");
  }
  spdlog::info(
      "encoded in {:.1f} s: {} train tokens ({} documents), {} val tokens ({} documents), "
      "{:.2f} bytes per token",
      seconds_since(start), report.train_tokens, report.train_documents, report.val_tokens,
      report.val_documents,
      static_cast<double>(report.text_bytes) / (report.train_tokens + report.val_tokens));
  return report;
}

}  // namespace mltrain
