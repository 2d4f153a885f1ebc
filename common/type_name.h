#pragma once

#include <cstdint>
#include <type_traits>

namespace mltrain {

// How an error message names the type a config value must have: "expects an integer".
template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, double>) return "a number";
  return "a string";
}

}  // namespace mltrain
