#pragma once

#include "trainer/config.h"

namespace mltrain {

// Builds the configured model on the configured device and reports what a run would train: the
// precision it would take, the parameter table, FLOPs per token and tokens per step. Trains and
// writes nothing.
void dry_run(const Config& config);

}  // namespace mltrain
