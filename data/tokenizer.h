#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mltrain {

// A SentencePiece model: text <-> token ids. Encoding is const and safe from several threads.
class Tokenizer {
 public:
  // A missing or unreadable model is a UserError naming the file.
  explicit Tokenizer(const std::filesystem::path& model);
  ~Tokenizer();

  std::vector<uint32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int>& ids) const;
  int64_t vocab_size() const;
  // The token that ends every document in a prepared corpus.
  uint32_t end_of_document() const;
  // The token of text the vocabulary cannot spell; -1 if it has none. Models that mlprep trains
  // fall back to bytes and never produce it.
  int64_t unknown() const;
  // The piece of an id (spaces as U+2581), and the id of a piece the vocabulary holds as one of
  // its own; none for any other text.
  std::string piece(uint32_t id) const;
  std::optional<uint32_t> piece_id(std::string_view piece) const;

  // The vocabulary in id order, as another tokenizer library needs it spelled out.
  enum class PieceKind { normal, control, unknown, byte, unused };
  struct Piece {
    std::string text;  // spaces as U+2581; a byte piece as <0xAB>
    float score;       // for BPE, the merge priority: higher merges first
    PieceKind kind;
  };
  std::vector<Piece> pieces() const;
  // The model file's contents, as SentencePiece loads it.
  std::string serialized() const;

 private:
  std::filesystem::path path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// The largest vocabulary a tokenizer can be trained for: SentencePiece keeps vocab_size as an
// int32 (its TrainerSpec), below the uint32 token ids a shard holds. A sample runs out of pieces
// long before; a size it cannot fill is said by train_tokenizer, once trained, with the most it
// can.
inline constexpr int64_t kMostVocabularySize = 0x7FFF'FFFF;

// Trains a byte-level BPE SentencePiece model on the documents and writes it atomically to
// `model`. Byte fallback makes every input encodable; no normalisation and no dummy prefix make
// decode(encode(text)) == text; the character coverage suits Chinese as well as English. A
// vocabulary too small or too large for the documents is a UserError in mlprep's terms.
// `control_pieces` (a chat template's markers) get ids of their own after the 3 special ones;
// like those, no text encodes to them.
void train_tokenizer(const std::vector<std::string>& documents, int64_t vocab_size, int threads,
                     const std::filesystem::path& model,
                     const std::vector<std::string>& control_pieces = {});

}  // namespace mltrain
