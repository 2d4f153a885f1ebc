#pragma once

#include "trainer/run/training_hooks.h"

namespace mltrain {

// The whole of the mltrain executable: joins the MPI world when a launcher started the process,
// parses the command line, and trains, resumes, evaluates, plots, dumps the config or dry-runs.
// Returns the exit code (0, or kExitUserError / kExitRuntimeFailure; a failing rank of several
// takes the others down). `hooks` reach the training run; the shipped binary passes none.
int run_mltrain(int argc, char** argv, const TrainingHooks& hooks = {});

}  // namespace mltrain
