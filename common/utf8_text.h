#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace mltrain {

// Where `text` stops being valid UTF-8 (the offset of the first byte that does not begin or
// continue a well-formed character: no overlong form, no surrogate, nothing past U+10FFFF), or
// none where it is valid. JSON and YAML files hold Unicode text only: a string that reaches one
// is checked where it enters, so that the writer never meets bytes it cannot write.
std::optional<size_t> invalid_utf8_at(std::string_view text);

// `text` with every byte that is not part of valid UTF-8 written as \xNN, for a message that
// names such a string without passing its bytes on.
std::string printable_utf8(std::string_view text);

// A UserError where `text` is not valid UTF-8, naming `what` it is (its origin and key).
void require_utf8(std::string_view text, const std::string& what);

}  // namespace mltrain
