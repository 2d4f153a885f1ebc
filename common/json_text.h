#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mltrain {

// A JSON value from a file, as an error message shows it: a number, true, false or null as
// written; a string quoted and cut to 40 characters; an array or an object by its kind alone.
// Never the whole of what a file holds: it may be huge, or nested deeper than printing it can
// recurse.
inline std::string json_value_text(const nlohmann::json& value) {
  if (value.is_array()) return "a JSON array";
  if (value.is_object()) return "a JSON object";
  constexpr size_t kShown = 40;
  if (value.is_string() && value.get_ref<const std::string&>().size() > kShown) {
    return nlohmann::json(value.get_ref<const std::string&>().substr(0, kShown) + "...")
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mltrain
