#include "launch/mltrain_command.h"

#include <fmt/core.h>

#include <csignal>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "dist/flight_record.h"
#include "dist/world.h"
#include "launch/mltrain_command_line.h"
#include "trainer/checkpoint/checkpoint_store.h"
#include "trainer/config/config.h"
#include "trainer/report/loss_plot.h"
#include "trainer/run/dry_run.h"
#include "trainer/run/evaluation.h"
#include "trainer/run/hf_export.h"
#include "trainer/run/training_run.h"

namespace mltrain {
namespace {

// CONFIG.yaml's config, or without one the config saved with the checkpoint of --resume, wherever
// that checkpoint now is: its data paths are absolute.
Config command_config(const CommandLine& command_line) {
  if (!command_line.config_path.empty())
    return load_config(command_line.config_path, command_line.overrides);
  const std::filesystem::path source = command_line.resume;
  return load_config(saved_config_for(source, find_weights(source)), command_line.overrides);
}

}  // namespace

int run_mltrain(int argc, char** argv, const TrainingHooks& hooks) {
  // A log read through a pipe (`mltrain ... | tee log`) must not end the run when its reader goes:
  // Ctrl-C takes tee down first, and the run still has a checkpoint to save.
  std::signal(SIGPIPE, SIG_IGN);
  // The launcher's variables are the user's to fix: a missing one is exit 2, from every rank.
  setup_logging(0);
  World world;
  if (const int code = guarded_main([&] {
        world = init_world(&argc, &argv);
        return 0;
      });
      code != 0)
    return code;
  setup_logging(world.rank);
  const int code = guarded_main([&] {
    const CommandLine command_line = parse_command_line(argc, argv);
    if (command_line.help) {
      fmt::print("{}", command_line_help());
      return 0;
    }
    if (!command_line.flight_report.empty()) {
      fmt::print("{}", flight_report(command_line.flight_report));
      return 0;
    }
    const Config config = command_config(command_line);
    if (command_line.dump_config) {
      fmt::print("{}", config_to_yaml(config));
    } else if (command_line.dry_run) {
      dry_run(config, world, {command_line.ranks, command_line.device_memory_gb});
    } else if (command_line.plot) {
      draw_loss_curve(config.train.run_dir);
    } else if (command_line.eval_only) {
      evaluate_weights(config,
                       command_line.resume == "auto" ? config.train.run_dir : command_line.resume);
    } else if (!command_line.export_hf.empty()) {
      // Several processes would race for the one output directory.
      if (world.size > 1)
        throw UserError("--export-hf runs in one process: start it without a launcher");
      export_hf(config, command_line.resume == "auto" ? config.train.run_dir : command_line.resume,
                command_line.export_hf);
    } else {
      train(config, command_line.resume, world, hooks);
    }
    return 0;
  });
  // A rank that fails takes the others down rather than leave them waiting in a collective.
  if (code != 0 && world.size > 1) abort_world(world, code);
  finalize_world(world);
  return code;
}

}  // namespace mltrain
