#pragma once

#include <filesystem>

#include "trainer/config.h"
#include "trainer/evaluation.h"

namespace mltrain {

// Trains the configured model from its seeded initial weights for train.max_steps optimizer
// steps: progress on the log every train.log_every steps, validation every train.eval_every steps
// and at the end, metrics in RUN_DIR/metrics.jsonl, the effective config in RUN_DIR/config.yaml,
// the final weights in RUN_DIR/model.safetensors and the loss curve in RUN_DIR/loss.png.
void train(const Config& config);

// Loads weights (a model.safetensors, or a run directory holding one), evaluates them on the
// validation windows, logs the loss and perplexity and records them in the metrics.jsonl beside the
// weights; writes nothing else.
Evaluation evaluate_weights(const Config& config, const std::filesystem::path& weights);

}  // namespace mltrain
