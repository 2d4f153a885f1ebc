#pragma once

#include "data/sampler.h"
#include "data/token_windows.h"
#include "trainer/config/config.h"

namespace mltrain {

// The data a run reads, opened and checked before anything large is allocated.

// Opens and validates the shards of `pattern` (the `split` of the log line: "train" or "val") as
// windows of data.seq_len + 1 tokens, and logs their size.
TokenWindows open_windows(const std::string& pattern, const Config& config, const char* split);

// Checks that data.tokenizer's vocabulary fits model.vocab_size. Training and evaluation read
// token shards, not text, so they need no tokenizer: without one (data.tokenizer empty, or the
// default path missing, as for llm.c shards) there is nothing to check and the log says so. A path
// set to something else that is missing is a UserError.
void check_tokenizer(const Config& config);

// The bytes of the run's tokenizer file, for its checkpoints to carry; empty when the run has none
// (data.tokenizer empty, or the default path with nothing there).
std::string read_tokenizer_model(const Config& config);

// A global batch (micro_batch x grad_accum x ranks windows) larger than the training windows is a
// UserError: each step would read some windows more than once, and the batch may not fit memory.
void check_batch_fits(const BatchLayout& layout, const TokenWindows& train_windows);

}  // namespace mltrain
