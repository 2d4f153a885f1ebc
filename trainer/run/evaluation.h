#pragma once

#include <c10/core/Device.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/sampler.h"
#include "data/token_windows.h"
#include "dist/communicator.h"
#include "model/layers/llama.h"
#include "trainer/config/config.h"
#include "trainer/run/run_data.h"

namespace mltrain {

struct Evaluation {
  double loss;        // mean next-token cross-entropy over every evaluated target, on all ranks
  double perplexity;  // exp(loss)
  int64_t tokens;
};

// Evaluates the model on the first `eval_batches` validation batches (0: all) in file order, the
// same windows on every run; each rank takes its slice and the sums are combined over the ranks.
// Gradients are off; bf16 autocast follows `bf16`, and attention stays within documents with a
// document_start (data.document_masking), as in training. Under ZeRO-3 the model's units are
// gathered one after the other as in training's forward, every rank running every batch.
Evaluation evaluate(Llama& model, const TokenWindows& windows, const BatchLayout& layout,
                    int64_t eval_batches, c10::Device device, bool bf16, Communicator& communicator,
                    std::optional<int64_t> document_start = std::nullopt);

// The evaluation of every source's validation windows (run_data.h), and their mean weighted by the
// sources' shares of the training samples: with one corpus, its own evaluation.
struct SourcesEvaluation {
  Evaluation mean;  // the weighted mean loss, its perplexity, and every source's tokens
  std::vector<std::pair<std::string, Evaluation>> by_source;  // of named sources; else empty

  // " | web 3.1234, code 2.3456", or "" for one corpus: what the log line adds.
  std::string by_source_text() const;
  // {"val_loss/web": 3.1234, ...}: what a metrics record adds.
  nlohmann::json by_source_json() const;
};
SourcesEvaluation evaluate_sources(Llama& model, const std::vector<RunSource>& sources,
                                   const BatchLayout& layout, int64_t eval_batches,
                                   c10::Device device, bool bf16, Communicator& communicator,
                                   std::optional<int64_t> document_start = std::nullopt);

// Loads weights (a Hugging Face model directory checked against config.model, see
// hf_checkpoint.h, or else what find_weights finds), evaluates them on the validation windows and
// logs the loss and perplexity (and each source's loss, with data.sources). When the weights are a
// run's checkpoint, the result is recorded in that run's metrics.jsonl, wherever the run directory
// now is; nothing else is written. A single-process operation.
Evaluation evaluate_weights(const Config& config, const std::filesystem::path& weights);

}  // namespace mltrain
