#include "common/utf8_text.h"

#include <fmt/format.h>

#include "common/error.h"

namespace mltrain {
namespace {

// The length of the well-formed character that begins `text` (RFC 3629's table of byte ranges),
// or 0 where none does.
size_t character_length(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto continues = [&](size_t i, unsigned char low = 0x80, unsigned char high = 0xBF) {
    return i < text.size() && byte(i) >= low && byte(i) <= high;
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continues(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    // E0 takes A0..BF (no overlong form), ED takes 80..9F (no surrogate).
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;
    return continues(1, low, high) && continues(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    // F0 takes 90..BF (no overlong form), F4 takes 80..8F (nothing past U+10FFFF).
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;
    return continues(1, low, high) && continues(2) && continues(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::optional<size_t> invalid_utf8_at(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = character_length(text.substr(at));
    if (length == 0) return at;
    at += length;
  }
  return std::nullopt;
}

std::string printable_utf8(std::string_view text) {
  std::string printable;
  for (size_t at = 0; at < text.size();) {
    const size_t length = character_length(text.substr(at));
    if (length == 0) {
      printable += fmt::format("\\x{:02X}", static_cast<unsigned char>(text[at]));
      ++at;
    } else {
      printable += text.substr(at, length);
      at += length;
    }
  }
  return printable;
}

void require_utf8(std::string_view text, const std::string& what) {
  if (const std::optional<size_t> at = invalid_utf8_at(text)) {
    throw UserError(fmt::format(
        "{} is not valid UTF-8 (\"{}\", byte {}): it is written into JSON and YAML files, which "
        "hold Unicode text only",
        what, printable_utf8(text), *at + 1));
  }
}

}  // namespace mltrain
