#include "data/text_stream.h"

namespace mltrain {

bool ends_mid_character(const std::string& text) {
  if (text.ends_with("\xEF\xBF\xBD")) return true;  // U+FFFD
  size_t continuation_bytes = 0;
  while (continuation_bytes < 3 && continuation_bytes < text.size() &&
         (static_cast<unsigned char>(text[text.size() - 1 - continuation_bytes]) & 0xC0) == 0x80)
    ++continuation_bytes;
  if (continuation_bytes == text.size()) return continuation_bytes > 0;
  const auto lead = static_cast<unsigned char>(text[text.size() - 1 - continuation_bytes]);
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return continuation_bytes + 1 < length;
}

std::string TextStream::add(int64_t token) {
  if (token == tokenizer_.end_of_document()) return {};
  ids_.push_back(static_cast<int>(token));
  const std::string text = tokenizer_.decode(ids_);
  return ends_mid_character(text) ? std::string() : take_new(text);
}

std::string TextStream::finish() { return take_new(tokenizer_.decode(ids_)); }

std::string TextStream::take_new(const std::string& text) {
  if (text.size() <= handed_out_) return {};
  std::string fresh = text.substr(handed_out_);
  handed_out_ = text.size();
  return fresh;
}

}  // namespace mltrain
