#pragma once

#include <string>
#include <vector>

namespace mltrain {

// mltrain CONFIG.yaml [--set section.key=value]... [--dry-run] [--dump-config] [--help]
struct CommandLine {
  std::string config_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  bool dump_config = false;
  bool help = false;
};

// Throws UserError for an unknown flag, a missing value or a missing config path.
CommandLine parse_command_line(int argc, const char* const* argv);

extern const char* const kUsage;

}  // namespace mltrain
