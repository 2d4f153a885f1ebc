#pragma once

#include "dist/world.h"
#include "trainer/config/config.h"

namespace mltrain {

// The machine a dry run plans for: `ranks` ranks (0: the launch's), each with device_memory_gb of
// GPU memory (0: this machine's device, which the dry run then also builds the model on).
struct DryRunTarget {
  int ranks = 0;
  double device_memory_gb = 0.0;
};

// Reports what a run would train and hold, and trains and writes nothing: the memory plan per
// rank (memory_plan.h), then, on this machine's device, the precision it would take, the
// parameter table, FLOPs per token and tokens per step. For GPUs of a given size the plan is for
// CUDA in the precision CUDA would take, and nothing is built.
void dry_run(const Config& config, const World& world, const DryRunTarget& target);

}  // namespace mltrain
