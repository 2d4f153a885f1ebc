#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain::testing {

// A tiny run in `dir` trained by the mltrain executable for 4 steps, checkpointed at steps 2 and
// 4; returns its config file.
inline std::string trained_run(const TemporaryDirectory& dir) {
  Config config = tiny_run(dir.path());
  config.train.max_steps = 4;
  config.train.ckpt_every = 2;
  config.optim.warmup_steps = 1;
  const auto path = dir / "run.yaml";
  write_text(path, config_to_yaml(config));
  const CommandResult trained = run_tool("mltrain", path.string());
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  return path.string();
}

}  // namespace mltrain::testing
