#pragma once

#include <string>
#include <vector>

namespace mltrain {

// mltrain CONFIG.yaml [--set section.key=value]... [--resume auto|PATH] [--eval-only]
//         [--export-hf OUT_DIR] [--dry-run [--ranks N] [--device-memory-gb GB]] [--dump-config]
//         [--plot] [--help]
// mltrain --resume PATH (--eval-only | --export-hf OUT_DIR) [--set section.key=value]...
// mltrain --flight-report RUN_DIR
struct CommandLine {
  std::string config_path;  // empty: the config saved with the checkpoint of --resume
  std::vector<std::string> overrides;
  std::string resume;  // "auto" (train.run_dir), a run directory or a weights file; empty: none
  bool eval_only = false;
  std::string export_hf;  // a directory to write the --resume weights to, for Hugging Face
  bool dry_run = false;
  int ranks = 0;                // the dry run's memory plan: for this many ranks (0: as launched)
  double device_memory_gb = 0;  // and this much memory per rank (0: this machine's device)
  bool dump_config = false;
  bool plot = false;
  std::string flight_report;  // a run directory whose flight records to print
  bool help = false;
};

// Throws UserError, one line naming the argument, for an unknown flag, a missing value or a
// missing config path (which only --eval-only and --export-hf with --resume PATH, and
// --flight-report, may leave out).
CommandLine parse_command_line(int argc, const char* const* argv);

// The --help text, made from the definitions parse_command_line parses with.
std::string command_line_help();

}  // namespace mltrain
