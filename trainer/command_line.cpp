#include "trainer/command_line.h"

#include <fmt/format.h>

#include <string_view>

#include "common/error.h"

namespace mltrain {

const char* const kUsage = R"(usage: mltrain CONFIG.yaml [options]

Trains the LLaMA-style model that CONFIG.yaml describes (see configs/README.md for every key).
Started by mpirun or srun, every process is one rank of a data-parallel run:
  mpirun -n 8 mltrain configs/base.yaml

options:
  --set section.key=value   override one config key (repeatable; later ones win)
  --resume auto|PATH        continue training from a checkpoint: auto is the newest in
                            train.run_dir (none: start fresh), else a checkpoint directory
  --eval-only               evaluate trained weights on the validation data and exit: those of
                            --resume (auto: the run's newest checkpoint, or a checkpoint
                            directory or .safetensors file)
  --plot                    draw RUN_DIR/loss.png from RUN_DIR/metrics.jsonl and exit
  --dry-run                 validate the config, build the model, print its parameters and
                            FLOPs per token, and exit
  --dump-config             print the effective config as YAML and exit
  --help                    print this help and exit

exit codes: 0 success, 1 runtime failure, 2 bad input (config, files, arguments)
)";

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine command_line;
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--help" || argument == "-h") {
      command_line.help = true;
    } else if (argument == "--dry-run") {
      command_line.dry_run = true;
    } else if (argument == "--dump-config") {
      command_line.dump_config = true;
    } else if (argument == "--eval-only") {
      command_line.eval_only = true;
    } else if (argument == "--plot") {
      command_line.plot = true;
    } else if (argument == "--resume") {
      if (i + 1 == argc) throw UserError("--resume needs auto or a path");
      command_line.resume = argv[++i];
    } else if (argument == "--set") {
      if (i + 1 == argc) throw UserError("--set needs section.key=value");
      command_line.overrides.emplace_back(argv[++i]);
    } else if (argument.starts_with("--set=")) {
      command_line.overrides.emplace_back(argument.substr(6));
    } else if (argument.starts_with("-")) {
      throw UserError(fmt::format("unknown option {} (see mltrain --help)", argument));
    } else if (command_line.config_path.empty()) {
      command_line.config_path = argument;
    } else {
      throw UserError(fmt::format("unexpected argument {}: give one config file", argument));
    }
  }
  if (command_line.config_path.empty() && !command_line.help) {
    throw UserError("no config file given (usage: mltrain CONFIG.yaml [options]; see --help)");
  }
  if (command_line.eval_only && command_line.resume.empty()) {
    throw UserError("--eval-only needs trained weights: add --resume auto (the run directory) or "
                    "--resume PATH");
  }
  return command_line;
}

}  // namespace mltrain
