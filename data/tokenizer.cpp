#include "data/tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <numeric>
#include <regex>
#include <string_view>
#include <unordered_map>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"

namespace mltrain {
namespace {

// The most threads SentencePiece's trainer takes (its VerifySpec).
constexpr int kMostTrainingThreads = 128;

// SentencePiece models are a few MB even for vocabularies of a million pieces.
constexpr uint64_t kMaxModelBytes = uint64_t{1} << 30;

// SentencePiece's trainer passes over a sentence longer than its max_sentence_length, so a corpus
// of long unbroken lines (a book as one line) would leave it nothing to learn from; and its BPE
// trainer (0.1.97) crashes on a run of some 45 KB without a space. Lines are fed in pieces of at
// most this much, SentencePiece's own default limit.
constexpr size_t kMaxLineBytes = 4096;

// The end of the piece of a line of `text` from `begin` that runs past kMaxLineBytes: after the
// last space of the piece's second half, else before the UTF-8 character that straddles the limit
// (a character has at most 3 continuation bytes; text that is not UTF-8 is cut at the limit).
size_t cut_point(const std::string& text, size_t begin) {
  const size_t limit = begin + kMaxLineBytes;
  for (size_t after = limit; after > begin + kMaxLineBytes / 2; --after)
    if (text[after - 1] == ' ') return after;
  const auto continuation = [&](size_t at) {
    return (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80;
  };
  for (size_t end = limit; end > limit - 4; --end)
    if (!continuation(end)) return end;
  return limit;
}

// Feeds the trainer one line of the documents at a time, a long one in pieces: SentencePiece
// learns from lines, and the newlines themselves are encoded through byte fallback.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& documents) : documents_(documents) {
    advance();
  }
  bool done() const override { return document_ >= documents_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (document_ < documents_.size()) {
      const std::string& text = documents_[document_];
      if (offset_ >= text.size()) {
        ++document_;
        offset_ = 0;
        continue;
      }
      // The newline is looked for within the piece only: a long line is not scanned again for
      // each of its pieces.
      const size_t window = std::min(text.size() - offset_, kMaxLineBytes + 1);
      const size_t newline = std::string_view(text).substr(offset_, window).find('\n');
      const size_t line_end =
          newline == std::string_view::npos ? offset_ + window : offset_ + newline;
      const bool too_long = line_end - offset_ > kMaxLineBytes;
      const size_t end = too_long ? cut_point(text, offset_) : line_end;
      line_ = text.substr(offset_, end - offset_);
      offset_ = too_long ? end : end + 1;
      if (!line_.empty()) return;
    }
  }

  const std::vector<std::string>& documents_;
  size_t document_ = 0;
  size_t offset_ = 0;
  std::string line_;
};

// SentencePiece gives every character within `character_coverage` of the text a piece of its own.
// Chinese text has thousands of characters, more than a small vocabulary holds, so the coverage is
// lowered until the commonest characters fill at most half the vocabulary (SentencePiece accepts
// no less than 0.98); the rarer ones are encoded through byte fallback.
double character_coverage(const std::vector<std::string>& documents, int64_t vocab_size) {
  constexpr double kFullCoverage = 0.9995;
  std::unordered_map<uint32_t, int64_t> counts;
  int64_t total = 0;
  for (const std::string& text : documents) {
    for (size_t i = 0; i < text.size();) {
      const unsigned char lead = static_cast<unsigned char>(text[i]);
      const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      uint32_t code = 0;
      for (size_t j = i; j < std::min(i + length, text.size()); ++j)
        code = code << 8 | static_cast<unsigned char>(text[j]);
      if (code != '\n') {
        ++counts[code];
        ++total;
      }
      i += length;
    }
  }
  std::vector<int64_t> frequencies;
  frequencies.reserve(counts.size());
  for (const auto& [code, count] : counts) frequencies.push_back(count);
  std::sort(frequencies.rbegin(), frequencies.rend());
  const size_t most_characters = static_cast<size_t>(vocab_size / 2);
  if (frequencies.size() <= most_characters) return kFullCoverage;
  const int64_t covered =
      std::accumulate(frequencies.begin(), frequencies.begin() + most_characters - 1, int64_t{0});
  constexpr double kLeastCoverage = 0.98;
  return std::clamp(static_cast<double>(covered) / static_cast<double>(total) - 1e-6,
                    kLeastCoverage, kFullCoverage);
}

}  // namespace

Tokenizer::Tokenizer(const std::filesystem::path& model)
    : path_(model), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::filesystem::exists(model)) {
    throw UserError(
        fmt::format("{}: tokenizer model not found (data.tokenizer; mlprep writes "
                    "tokenizer.model beside the shards)",
                    model.string()));
  }
  const auto status =
      processor_->LoadFromSerializedProto(read_text_file(model, "tokenizer model", kMaxModelBytes));
  if (!status.ok()) {
    throw UserError(
        fmt::format("{}: not a SentencePiece model ({})", model.string(), status.ToString()));
  }
}

Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("SentencePiece encode failed: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  return processor_->DecodeIds(ids);
}

int64_t Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }

uint32_t Tokenizer::end_of_document() const { return static_cast<uint32_t>(processor_->eos_id()); }

int64_t Tokenizer::unknown() const { return processor_->unk_id(); }

std::string Tokenizer::piece(uint32_t id) const {
  return processor_->IdToPiece(static_cast<int>(id));
}

std::optional<uint32_t> Tokenizer::piece_id(std::string_view piece) const {
  // PieceToId answers the unknown piece's id for any text that is no piece.
  const int id = processor_->PieceToId(piece);
  if (id < 0 || processor_->IdToPiece(id) != piece) return std::nullopt;
  return static_cast<uint32_t>(id);
}

std::string Tokenizer::serialized() const { return processor_->serialized_model_proto(); }

std::vector<Tokenizer::Piece> Tokenizer::pieces() const {
  const auto kind_of = [&](int id) {
    if (processor_->IsUnknown(id)) return PieceKind::unknown;
    if (processor_->IsControl(id)) return PieceKind::control;
    if (processor_->IsByte(id)) return PieceKind::byte;
    if (processor_->IsUnused(id)) return PieceKind::unused;
    return PieceKind::normal;  // train_tokenizer defines no user symbols
  };
  std::vector<Piece> pieces;
  pieces.reserve(static_cast<size_t>(processor_->GetPieceSize()));
  for (int id = 0; id < processor_->GetPieceSize(); ++id)
    pieces.push_back({processor_->IdToPiece(id), processor_->GetScore(id), kind_of(id)});
  return pieces;
}

namespace {

// SentencePiece's reason for failing, in mlprep's terms where it is the one users meet: a
// vocabulary smaller than the corpus's characters need ("... smaller than required_chars. 1024 vs
// 2204. ...", where the second count includes the byte and special pieces).
std::string training_failure(const std::string& reason, int64_t vocab_size, double coverage) {
  static const std::regex too_small(R"(smaller than required_chars\. \d+ vs (\d+))");
  // "Vocabulary size too high (100000). Please set it to a value <= 654.": the sample ran out of
  // pieces to merge first.
  static const std::regex too_large(
      R"(Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+))");
  std::smatch needed;
  if (std::regex_search(reason, needed, too_large)) {
    return fmt::format(
        "--vocab-size {} is too large for this corpus: its sample makes at most {} tokens: give "
        "--vocab-size {} or less, or more text (--tokenizer-sample-mb, more inputs)",
        vocab_size, needed[1].str(), needed[1].str());
  }
  if (!std::regex_search(reason, needed, too_small))
    return fmt::format("training a {}-token tokenizer failed: {}", vocab_size, reason);
  return fmt::format(
      "--vocab-size {} is too small for this corpus: its tokenizer needs at least {} tokens (a "
      "piece for each of the characters that make up {:.2f}% of the sampled text, 256 byte pieces "
      "and 3 special ones): give --vocab-size {} or more, and a model.vocab_size at least as large",
      vocab_size, needed[1].str(), 100.0 * coverage, needed[1].str());
}

}  // namespace

void train_tokenizer(const std::vector<std::string>& documents, int64_t vocab_size, int threads,
                     const std::filesystem::path& model,
                     const std::vector<std::string>& control_pieces) {
  const double coverage = character_coverage(documents, vocab_size);
  std::unordered_map<std::string, std::string> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", std::to_string(coverage)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", std::to_string(kMaxLineBytes)},
      {"input_sentence_size", "4000000"},
      {"shuffle_input_sentence", "true"},
      // SentencePiece refuses more than 128 threads, and a machine can have more cores than that.
      {"num_threads", std::to_string(std::min(threads, kMostTrainingThreads))},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  if (!control_pieces.empty()) {
    std::string symbols;
    for (const std::string& piece : control_pieces) symbols += (symbols.empty() ? "" : ",") + piece;
    options["control_symbols"] = symbols;
  }
  LineIterator lines(documents);
  std::string serialized;
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &lines, &serialized);
  if (!status.ok()) throw UserError(training_failure(status.ToString(), vocab_size, coverage));
  write_file_atomically(model, serialized);
}

}  // namespace mltrain
