#pragma once

#include <filesystem>
#include <string>

#include "dist/world.h"
#include "trainer/config/config.h"
#include "trainer/run/training_hooks.h"

namespace mltrain {

// Trains the configured model for train.max_steps optimizer steps on the ranks of `world`, from
// its seeded initial weights (rank 0's, broadcast) or, with `resume` ("auto": the run's newest
// checkpoint; else a checkpoint directory), from where a checkpoint left off, on the same data
// order and schedule. Gradients are averaged over the ranks by a bucketed reducer, overlapped with
// backward where dist.overlap says (dist/grad_reducer.h).
// Rank 0 logs progress every train.log_every steps, validates every train.eval_every steps and at
// the end, appends to RUN_DIR/metrics.jsonl, writes the effective config to RUN_DIR/config.yaml,
// checkpoints every train.ckpt_every steps, at the end, at train.stop_at and when SIGTERM, SIGINT
// or SIGUSR1 asks any rank to stop, and draws RUN_DIR/loss.png. A non-finite step or a loss spike
// is skipped; after train.max_bad_steps in a row the run rolls back to its last checkpoint and
// trains on past the samples behind them, or, with no checkpoint or no step applied since the last
// rollback, stops with a runtime error.
void train(const Config& config, const std::string& resume = "", const World& world = World(),
           const TrainingHooks& hooks = {});

}  // namespace mltrain
