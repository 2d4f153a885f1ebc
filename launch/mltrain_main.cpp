// mltrain: trains, resumes or evaluates a LLaMA-style model described by a YAML config.
#include <fmt/core.h>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "dist/world.h"
#include "trainer/command_line.h"
#include "trainer/config.h"
#include "trainer/dry_run.h"
#include "trainer/loss_plot.h"
#include "trainer/training_run.h"

int main(int argc, char** argv) {
  const mltrain::World world = mltrain::init_world(&argc, &argv);
  mltrain::setup_logging(world.rank);
  const int code = mltrain::guarded_main([&] {
    const mltrain::CommandLine command_line = mltrain::parse_command_line(argc, argv);
    if (command_line.help) {
      fmt::print("{}", mltrain::kUsage);
      return 0;
    }
    const mltrain::Config config =
        mltrain::load_config(command_line.config_path, command_line.overrides);
    if (command_line.dump_config) {
      fmt::print("{}", mltrain::config_to_yaml(config));
    } else if (command_line.dry_run) {
      mltrain::dry_run(config);
    } else if (command_line.plot) {
      mltrain::draw_loss_curve(config.train.run_dir);
    } else if (command_line.eval_only) {
      mltrain::evaluate_weights(config, command_line.resume == "auto" ? config.train.run_dir : command_line.resume);
    } else {
      mltrain::train(config, command_line.resume, world);
    }
    return 0;
  });
  // A rank that fails takes the others down rather than leave them waiting in a collective.
  if (code != 0 && world.size > 1) mltrain::abort_world(world, code);
  mltrain::finalize_world(world);
  return code;
}
