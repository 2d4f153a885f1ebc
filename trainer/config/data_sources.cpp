#include "trainer/config/data_sources.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "common/error.h"
#include "common/utf8_text.h"

namespace mltrain {
namespace {

constexpr const char* kForm = "{name: ..., train: GLOB, val: GLOB, weight: NUMBER}";

// The text of an entry's string `key`, required.
std::string text_of(const YAML::Node& entry, const char* key, const std::string& where) {
  const YAML::Node value = entry[key];
  if (!value) throw UserError(fmt::format("{}: no {} (each source is {})", where, key, kForm));
  if (value.IsNull()) return "";  // `name:` with nothing after it
  if (!value.IsScalar())
    throw UserError(fmt::format("{}: {} must be text, got a YAML {}", where, key,
                                value.IsMap() ? "mapping" : "sequence"));
  require_utf8(value.Scalar(), fmt::format("{}: {}", where, key));
  return value.Scalar();
}

}  // namespace

std::vector<DataSource> read_data_sources(const YAML::Node& node, const std::string& origin) {
  std::vector<DataSource> sources;
  if (node.IsNull()) return sources;  // `sources:` or `--set data.sources=`: none
  if (!node.IsSequence())
    throw UserError(fmt::format("{}: data.sources must be a list of {}", origin, kForm));
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node entry = node[i];
    const std::string where = fmt::format("{}: data.sources entry {}", origin, i + 1);
    if (!entry.IsMap()) throw UserError(fmt::format("{} must be {}", where, kForm));
    // A key given twice would be read once, silently (YAML parsers keep the first here): refused,
    // as in every other mapping of the config.
    std::set<std::string> keys;
    for (const auto& item : entry) {
      const std::string key = item.first.IsScalar() ? item.first.Scalar() : "?";
      if (key != "name" && key != "train" && key != "val" && key != "weight")
        throw UserError(fmt::format("{}: unknown key {} (each source is {})", where, key, kForm));
      if (!keys.insert(key).second)
        throw UserError(fmt::format("{}: {} is given twice: keep one", where, key));
    }
    DataSource source;
    source.name = text_of(entry, "name", where);
    source.train = text_of(entry, "train", where);
    source.val = text_of(entry, "val", where);
    if (const YAML::Node weight = entry["weight"]) {
      try {
        source.weight = weight.as<double>();
      } catch (const YAML::Exception&) {
        throw UserError(fmt::format("{} ({}): weight must be a number, got {}", where, source.name,
                                    weight.IsScalar() ? weight.Scalar() : "a list"));
      }
    }
    sources.push_back(std::move(source));
  }
  return sources;
}

void emit_data_sources(YAML::Emitter& out, const std::vector<DataSource>& sources) {
  out << YAML::Flow << YAML::BeginSeq;
  for (const DataSource& source : sources) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << source.name;
    out << YAML::Key << "train" << YAML::Value << YAML::DoubleQuoted << source.train;
    out << YAML::Key << "val" << YAML::Value << YAML::DoubleQuoted << source.val;
    out << YAML::Key << "weight" << YAML::Value << source.weight;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

std::string show_data_sources(const std::vector<DataSource>& sources) {
  YAML::Emitter out;
  emit_data_sources(out, sources);
  return out.c_str();
}

void check_data_sources(const Config& config, const std::string& source) {
  if (config.sources.empty()) return;
  std::set<std::string> names;
  double total = 0.0;
  for (size_t i = 0; i < config.sources.size(); ++i) {
    const DataSource& entry = config.sources[i];
    const std::string where = fmt::format("{}: data.sources entry {}", source, i + 1);
    if (entry.name.empty()) throw UserError(fmt::format("{}: its name is empty", where));
    if (!names.insert(entry.name).second)
      throw UserError(fmt::format("{}: the name {} is given twice", where, entry.name));
    if (!std::isfinite(entry.weight) || entry.weight < 0) {
      throw UserError(fmt::format("{} ({}): weight must be a finite number of at least 0, got {}",
                                  where, entry.name, entry.weight));
    }
    total += entry.weight;
  }
  if (total == 0) {
    throw UserError(fmt::format(
        "{}: every weight of data.sources is 0: give at least one source a positive weight",
        source));
  }
  // Each source's share is its weight over the sum, which must be a number.
  if (!std::isfinite(total)) {
    throw UserError(fmt::format(
        "{}: the weights of data.sources add up to more than a double holds: only their ratios "
        "count, so give them smaller",
        source));
  }
}

}  // namespace mltrain
