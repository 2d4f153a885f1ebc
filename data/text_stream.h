#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mltrain {

// Turns tokens into text as they come, for printing while a model generates. The whole text so
// far is detokenised each time and only what is new handed out, so that pieces which combine
// (the byte pieces of one character, a space that decoding places by what follows) come out as
// the text they make together, and never half a UTF-8 character.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // The text `token` completes, possibly empty: nothing while the text ends inside a character
  // that more tokens will complete. The end-of-document token adds nothing.
  std::string add(int64_t token);

  // Whatever is left, complete or not, when no more tokens will come.
  std::string finish();

 private:
  std::string take_new(const std::string& text);

  const Tokenizer& tokenizer_;
  std::vector<int> ids_;
  size_t handed_out_ = 0;  // bytes of the decoded text already returned
};

// Whether `text` ends inside a character that more bytes would complete: in an incomplete UTF-8
// sequence, or in the replacement character that decoding gives the first byte pieces of one.
bool ends_mid_character(const std::string& text);

}  // namespace mltrain
