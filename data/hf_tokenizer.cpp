#include "data/hf_tokenizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/atomic_file.h"
#include "common/json_text.h"
#include "common/utf8_text.h"
#include "data/tokenizer.h"

namespace mltrain {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Offsets of the UTF-8 character boundaries inside `text`, excluding 0 and text.size().
std::vector<size_t> inner_character_boundaries(const std::string& text) {
  std::vector<size_t> boundaries;
  for (size_t i = 1; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) boundaries.push_back(i);
  }
  return boundaries;
}

// SentencePiece's BPE stores no merges: it starts from characters and repeatedly joins the
// adjacent pair whose concatenation is the highest-scoring piece. A `tokenizers` BPE joins the
// pair of lowest merge rank. Listing every split of every normal piece into two normal pieces,
// ranked by the joined piece's score, makes the two agree.
Json merges_of(const std::vector<Tokenizer::Piece>& pieces) {
  std::unordered_map<std::string, size_t> normal_ids;
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (pieces[id].kind == Tokenizer::PieceKind::normal) normal_ids.emplace(pieces[id].text, id);
  }
  // (score of the joined piece, id of the left part, id of the right part)
  std::vector<std::tuple<float, size_t, size_t>> merges;
  for (const auto& [text, id] : normal_ids) {
    for (const size_t split : inner_character_boundaries(text)) {
      const auto left = normal_ids.find(text.substr(0, split));
      const auto right = normal_ids.find(text.substr(split));
      if (left != normal_ids.end() && right != normal_ids.end())
        merges.emplace_back(pieces[id].score, left->second, right->second);
    }
  }
  // Highest score first; the ids break ties between splits of one piece deterministically.
  std::sort(merges.begin(), merges.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(-std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::make_tuple(-std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  Json list = Json::array();
  for (const auto& [score, left, right] : merges)
    list.push_back({pieces[left].text, pieces[right].text});
  return list;
}

// Control and unknown pieces are special tokens: never produced from text by the BPE, and left
// out of decoded text.
bool is_special(Tokenizer::PieceKind kind) {
  return kind == Tokenizer::PieceKind::control || kind == Tokenizer::PieceKind::unknown;
}

// tokenizer.json in the format of the `tokenizers` library: the normaliser mirrors the options
// train_tokenizer trains with (identity normalisation, no dummy prefix), so a space is the only
// character rewritten; the decoder undoes it and joins byte-fallback pieces into characters.
Json tokenizer_json(const std::vector<Tokenizer::Piece>& pieces, const std::string& unknown) {
  Json added = Json::array();
  Json vocabulary = Json::object();
  for (size_t id = 0; id < pieces.size(); ++id) {
    vocabulary[pieces[id].text] = id;
    if (is_special(pieces[id].kind)) {
      added.push_back({{"id", id},
                       {"content", pieces[id].text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
  }
  const auto replace = [](const std::string& from, const std::string& to) {
    return Json{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
  };
  return Json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", replace(" ", kSpace)},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", {replace(kSpace, " "), {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", unknown.empty() ? Json(nullptr) : Json(unknown)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        // A word that is itself a piece still goes through the merges, as in SentencePiece.
        {"ignore_merges", false},
        {"vocab", vocabulary},
        {"merges", merges_of(pieces)}}}};
}

}  // namespace

void write_hf_tokenizer(const std::filesystem::path& sentencepiece_model,
                        const std::filesystem::path& directory) {
  const Tokenizer tokenizer(sentencepiece_model);
  const std::vector<Tokenizer::Piece> pieces = tokenizer.pieces();
  std::string unknown;
  for (size_t id = 0; id < pieces.size(); ++id) {
    // tokenizer.json holds each piece as JSON text: a model whose piece is other bytes (which
    // SentencePiece's format allows) cannot be written there as it is.
    require_utf8(pieces[id].text, fmt::format("{}: piece {}", sentencepiece_model.string(), id));
    if (pieces[id].kind == Tokenizer::PieceKind::unknown) unknown = pieces[id].text;
  }
  Json special_tokens = Json::object();
  // A document starts where the one before ended, as the corpus is trained on (hf_export.cpp).
  // A model without the token (SentencePiece reports it as -1) names none.
  if (tokenizer.end_of_document() < pieces.size()) {
    const std::string end = pieces[tokenizer.end_of_document()].text;
    special_tokens.update({{"bos_token", end}, {"eos_token", end}});
  }
  if (!unknown.empty()) special_tokens["unk_token"] = unknown;

  // The generic fast-tokenizer class takes tokenizer.json as it is; LlamaTokenizer would rebuild
  // the normaliser with a dummy prefix, which this tokenizer was trained without.
  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 // Decoding must give back the text as it was, spaces before punctuation included.
                 {"clean_up_tokenization_spaces", false},
                 // What a causal LM takes; older transformers would add token_type_ids too.
                 {"model_input_names", Json::array({"input_ids", "attention_mask"})}};
  config.update(special_tokens);

  std::filesystem::create_directories(directory);
  write_file_atomically(directory / "tokenizer.json",
                        json_text(tokenizer_json(pieces, unknown), 1));
  write_file_atomically(directory / "tokenizer_config.json", json_text(config, 2) + "\n");
  write_file_atomically(directory / "special_tokens_map.json", json_text(special_tokens, 2) + "\n");
  // Written, not copied, so that it is flushed to disk before the export directory is published.
  write_file_atomically(directory / "tokenizer.model", tokenizer.serialized());
}

}  // namespace mltrain
