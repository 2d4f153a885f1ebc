#pragma once

#include <filesystem>

#include "trainer/config.h"
#include "trainer/evaluation.h"

namespace mltrain {

// Trains the configured model for train.max_steps optimizer steps, from its seeded initial weights
// or, with `resume` ("auto": the run's newest checkpoint; else a checkpoint directory), from where
// a checkpoint left off, on the same data order and schedule. Progress on the log every
// train.log_every steps; validation every train.eval_every steps and at the end; metrics in
// RUN_DIR/metrics.jsonl; the effective config in RUN_DIR/config.yaml; checkpoints every
// train.ckpt_every steps, at the end, at train.stop_at and when SIGTERM, SIGINT or SIGUSR1 asks the
// run to stop; the loss curve in RUN_DIR/loss.png. A non-finite step is skipped; after
// train.max_bad_steps in a row the run stops with a runtime error.
void train(const Config& config, const std::string& resume = "");

// Loads weights (see find_weights), evaluates them on the
// validation windows, logs the loss and perplexity and records them in RUN_DIR/metrics.jsonl (when
// the run directory exists); writes nothing else.
Evaluation evaluate_weights(const Config& config, const std::filesystem::path& weights);

}  // namespace mltrain
