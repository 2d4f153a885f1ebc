#include "launch/mltrain_command_line.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <utility>

#include "common/error.h"
#include "dist/world.h"
#include "launch/number_arguments.h"

namespace mltrain {
namespace {

const char* const kDescription =
    R"(Trains the LLaMA-style model that CONFIG.yaml describes (see configs/README.md for every key).
Started by mpirun or srun, every process is one rank of a data-parallel run:
  mpirun -n 8 mltrain configs/base.yaml
)";

// The most memory a dry run plans for: beyond it, a number is a slip.
constexpr double kMostDeviceMemoryGb = 1e6;

const char* const kFooter =
    "exit codes: 0 success, 1 runtime failure, 2 bad input (config, files, arguments)";

// mltrain's arguments, bound to `command_line`: parsing and --help both come from here.
void define_arguments(CLI::App& app, CommandLine& command_line) {
  app.name("mltrain");
  app.description(kDescription);
  app.footer(kFooter);
  // Unknown arguments are kept, not thrown, so that the error about them is one line of ours.
  app.allow_extras();
  // A repeated option takes its last value, as --set's later overrides win.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("CONFIG.yaml", command_line.config_path,
                 "the run's config; --eval-only and --export-hf without one take\n"
                 "the config saved with the checkpoint of --resume")
      ->type_name("");
  app.add_option("--set", command_line.overrides,
                 "override one config key (repeatable; later ones win)")
      ->type_name("section.key=value")
      ->allow_extra_args(
          false);  // one value per --set, so the config path after it stays the config
  app.add_option("--resume", command_line.resume,
                 "continue training from a checkpoint: auto is the newest in\n"
                 "train.run_dir (none: start fresh), else a checkpoint directory")
      ->type_name("auto|PATH");
  app.add_flag("--eval-only", command_line.eval_only,
               "evaluate trained weights on the validation data and exit: those of\n"
               "--resume (auto: the run's newest checkpoint, or a checkpoint\n"
               "directory or .safetensors file, or a Hugging Face model directory)");
  app.add_option("--export-hf", command_line.export_hf,
                 "write the weights of --resume (auto: the run's newest checkpoint)\n"
                 "as a new Hugging Face LlamaForCausalLM directory, with the\n"
                 "tokenizer when the run has one, and exit")
      ->type_name("OUT_DIR")
      // An empty value (an unset shell variable) must not fall back to training.
      ->check(CLI::Validator(
          [](const std::string& value) {
            return value.empty() ? std::string("expected a directory, got an empty value")
                                 : std::string();
          },
          ""));
  app.add_option("--flight-report", command_line.flight_report,
                 "print where each rank was when a collective failed or hung, from\n"
                 "the flight records in RUN_DIR/flight, and exit")
      ->type_name("RUN_DIR");
  app.add_flag("--plot", command_line.plot,
               "draw RUN_DIR/loss.png from RUN_DIR/metrics.jsonl and exit");
  app.add_flag("--dry-run", command_line.dry_run,
               "validate the config, print the memory plan per rank, build the\n"
               "model, print its precision, parameters and FLOPs per token, and exit");
  app.add_option("--ranks", command_line.ranks,
                 "the dry run's memory plan for this many ranks (default: as launched)")
      ->type_name("N")
      ->check(integer_between(1, kMostRanks));
  app.add_option("--device-memory-gb", command_line.device_memory_gb,
                 "the dry run's memory plan for GPUs of this many GB each, on\n"
                 "a machine that need not have them (the model is not built)")
      ->type_name("GB")
      ->check(text_check(
          [](const std::string& value) {
            const double gb = parse_number<double>(value).value_or(0.0);
            return gb > 0.0 && gb <= kMostDeviceMemoryGb;
          },
          fmt::format("a number of GB above 0 and at most {}", kMostDeviceMemoryGb)));
  app.add_flag("--dump-config", command_line.dump_config,
               "print the effective config as YAML and exit");
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine command_line;
  CLI::App app;
  define_arguments(app, command_line);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    command_line.help = true;
    return command_line;
  } catch (const CLI::ParseError& error) {
    throw UserError(fmt::format("{} (see mltrain --help)", error.what()));
  }
  // An unknown flag is reported before a missing config: in `mltrain --dryrun` it is the mistake.
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty() && extra.front().starts_with("-")) {
    throw UserError(fmt::format("unknown option {} (see mltrain --help)", extra.front()));
  }
  if (!extra.empty()) {
    throw UserError(fmt::format("unexpected argument {}: give one config file", extra.front()));
  }
  const bool reads_weights = command_line.eval_only || !command_line.export_hf.empty();
  if (!command_line.flight_report.empty()) {
    const bool anything_else =
        !command_line.config_path.empty() || reads_weights || !command_line.resume.empty() ||
        !command_line.overrides.empty() || command_line.dry_run || command_line.ranks != 0 ||
        command_line.device_memory_gb != 0 || command_line.dump_config || command_line.plot;
    if (anything_else)
      throw UserError("--flight-report RUN_DIR is a command of its own: give it alone");
    return command_line;
  }
  if (command_line.config_path.empty() && !reads_weights)
    throw UserError("no config file given (see mltrain --help)");
  for (const auto& [flag, given] : {std::pair{"--eval-only", command_line.eval_only},
                                    std::pair{"--export-hf", !command_line.export_hf.empty()}}) {
    if (given && command_line.resume.empty()) {
      throw UserError(fmt::format(
          "{} needs trained weights: add --resume auto (the run directory) or --resume PATH",
          flag));
    }
  }
  if (command_line.config_path.empty() && command_line.resume == "auto") {
    throw UserError(
        "--resume auto is the newest checkpoint of the config's train.run_dir: give CONFIG.yaml, "
        "or --resume RUN_DIR");
  }
  if ((command_line.ranks != 0 || command_line.device_memory_gb != 0) && !command_line.dry_run)
    throw UserError("--ranks and --device-memory-gb shape the plan of --dry-run: add --dry-run");
  if (command_line.eval_only && !command_line.export_hf.empty())
    throw UserError("--eval-only and --export-hf are two commands: give one");
  return command_line;
}

std::string command_line_help() {
  CommandLine unused;
  CLI::App app;
  define_arguments(app, unused);
  return app.help();
}

}  // namespace mltrain
