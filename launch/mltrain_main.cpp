// mltrain: trains, resumes or evaluates a LLaMA-style model described by a YAML config.
#include <fmt/core.h>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "trainer/command_line.h"
#include "trainer/config.h"
#include "trainer/dry_run.h"

int main(int argc, char** argv) {
  mltrain::setup_logging(/*rank=*/0);
  return mltrain::guarded_main([&] {
    const mltrain::CommandLine command_line = mltrain::parse_command_line(argc, argv);
    if (command_line.help) {
      fmt::print("{}", mltrain::kUsage);
      return 0;
    }
    const mltrain::Config config =
        mltrain::load_config(command_line.config_path, command_line.overrides);
    if (command_line.dump_config) {
      fmt::print("{}", mltrain::config_to_yaml(config));
      return 0;
    }
    if (command_line.dry_run) {
      mltrain::dry_run(config);
      return 0;
    }
    throw mltrain::UserError("training is not implemented yet: use --dry-run or --dump-config");
  });
}
