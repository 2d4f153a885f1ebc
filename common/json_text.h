#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mltrain {

// `value` as JSON text, as nlohmann's dump(indent) writes it, except that a string that is not
// valid UTF-8 has U+FFFD in place of each bad byte rather than failing the write (nlohmann's
// type_error 316). Names and config values are refused at entry (utf8_text.h); what may still
// hold such bytes is a path the user did not type (a working directory in another encoding), and
// a record of it is worth more than a failed save.
template <class Json>
std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

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
