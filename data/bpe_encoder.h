#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace mltrain {

// SentencePiece's BPE encoding, done again for speed: Debian's libsentencepiece encodes about
// 3 MB/s of text on one thread, this about 25. It gives SentencePiece's ids exactly, for the
// models mlprep trains: byte-fallback BPE without normalisation, whose pieces never hold a space
// mark after anything but space marks. So the text is cut before each space mark that follows
// something else, no piece can span a cut, and each cut segment is merged alone (pairs by the
// merged piece's score, the leftmost first on a tie) and cached, words repeating as they do.
class BpeEncoder {
 public:
  // For a model it encodes exactly: all 256 byte pieces, no unused ones, no piece with a space
  // mark after anything but space marks, and SentencePiece's own ids on a set of probe texts (which
  // a dummy prefix, a normalisation or another model type changes). None for any other model. The
  // tokenizer must outlive the encoder.
  static std::optional<BpeEncoder> for_model(const Tokenizer& tokenizer);

  // The ids of `text`, as tokenizer.encode gives them. Text that is not valid UTF-8, which
  // SentencePiece first repairs, goes to the tokenizer itself. Safe from several threads.
  std::vector<uint32_t> encode(std::string_view text) const;

 private:
  explicit BpeEncoder(const Tokenizer& tokenizer);
  std::vector<uint32_t> encode_segment(std::string_view segment) const;

  struct Piece {
    uint32_t id;
    float score;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  const Tokenizer* tokenizer_;
  std::unordered_map<std::string, Piece, StringHash, std::equal_to<>> pieces_;
  std::vector<uint32_t> byte_pieces_;  // the id of <0xAB> at 0xAB
  uint64_t identity_;                  // tells the threads' segment caches apart
};

}  // namespace mltrain
