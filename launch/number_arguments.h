#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace mltrain {

// Numbers on the executables' command lines are checked as text, before CLI11 converts them, so
// that an error says what is expected ("--ranks: expected an integer from 1 to 1048576, got
// "0""), and so that nan, inf and numbers past their type's range are refused rather than
// converted into something else.

// All of `text` as one finite number of type Number, or none.
template <typename Number>
std::optional<Number> parse_number(const std::string& text) {
  Number number{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<Number>) {
    if (!std::isfinite(number)) return std::nullopt;
  }
  return number;
}

// A check of an option's text: `accepts` holds it or not, `expected` says what it should be.
inline CLI::Validator text_check(std::function<bool(const std::string&)> accepts,
                                 std::string expected) {
  return CLI::Validator(
      [accepts = std::move(accepts), expected = std::move(expected)](const std::string& value) {
        if (accepts(value)) return std::string();
        return fmt::format("expected {}, got \"{}\"", expected, value);
      },
      "");
}

inline CLI::Validator integer_between(int64_t min, int64_t max) {
  return text_check(
      [min, max](const std::string& value) {
        const std::optional<int64_t> number = parse_number<int64_t>(value);
        return number && *number >= min && *number <= max;
      },
      fmt::format("an integer from {} to {}", min, max));
}

inline CLI::Validator integer_at_least(int64_t min) {
  return text_check(
      [min](const std::string& value) {
        const std::optional<int64_t> number = parse_number<int64_t>(value);
        return number && *number >= min;
      },
      fmt::format("an integer of at least {}", min));
}

}  // namespace mltrain
