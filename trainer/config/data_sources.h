#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace mltrain {

// data.sources in a config file or a --set:
//   sources:
//     - {name: web, train: "data/web/train_*.bin", val: "data/web/val_*.bin", weight: 0.7}
//     - {name: code, train: "data/code/train_*.bin", val: "data/code/val_*.bin", weight: 0.3}
// An entry that is not such a mapping, a key other than these, a missing name, train or val, or a
// value of the wrong type is a UserError naming `origin` and the entry.
std::vector<DataSource> read_data_sources(const YAML::Node& node, const std::string& origin);

// The list as YAML writes it back (a flow sequence of flow mappings), and as one line of text.
void emit_data_sources(YAML::Emitter& out, const std::vector<DataSource>& sources);
std::string show_data_sources(const std::vector<DataSource>& sources);

// The checks between the entries: names unique, weights finite and not negative, and not all 0.
// Each a UserError naming `source` (the config file) and the entry.
void check_data_sources(const Config& config, const std::string& source);

}  // namespace mltrain
