#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/blended_sampler.h"
#include "data/sampler.h"
#include "data/token_windows.h"
#include "trainer/checkpoint/checkpoint_state.h"
#include "trainer/config/config.h"

namespace mltrain {

// The data a run reads, opened and checked before anything large is allocated.

// Opens and validates the shards of `pattern` (the `split` of the log line: "train" or "val") as
// windows of data.seq_len + 1 tokens, and logs their size.
TokenWindows open_windows(const std::string& pattern, const Config& config, const char* split);

// A corpus the run reads: an entry of data.sources, or the one corpus of data.train and data.val
// (named "", weight 1).
struct RunSource {
  std::string name;
  double weight = 1.0;
  std::optional<TokenWindows> train;  // none where only validation reads the sources
  TokenWindows val;
};

// Opens and validates every source's shards (with `train`, the training shards too), logging each
// source's tokens and windows, and checks
// that the sources were made with one tokenizer: a tokenizer.model beside a source's training
// shards that differs from data.tokenizer (or, without one, from another source's) is a UserError
// naming the source, as is a glob that matches nothing.
std::vector<RunSource> open_sources(const Config& config, bool train = true);

// The run's training order over `sources` from `segment` (data/blended_sampler.h), each source
// with its seed under data.seed.
BlendedSampler blend_of(const std::vector<RunSource>& sources, const Config& config,
                        const BatchLayout& layout, BlendSegment segment);

// Where a resumed run's blend stands: the segment of its current weights, and the checkpoint's
// sources that the config no longer lists, kept with their counts (weight 0), so that one listed
// again goes on from where it stopped.
struct BlendResume {
  BlendSegment segment;
  std::vector<SourceProgress> unlisted;
};

// The blend of `sources` resumed at `progress` (none consumed: from the start). The checkpoint's
// segment goes on where it blended the same sources in the same order at the same shares and its
// replay reaches the saved counts; else a new segment starts at the samples consumed, each source
// going on from its saved count (a new one from 0), which keeps every source's epoch whole. A
// checkpoint of one corpus (which records no blend) counts as a blend of that corpus alone.
BlendResume resume_blend(const std::vector<RunSource>& sources, const TrainingProgress& progress,
                         const Config& config, const BatchLayout& layout);

// Each source's share of the training samples: its weight over the sum.
std::vector<double> shares_of(const std::vector<RunSource>& sources);

// Checks that data.tokenizer's vocabulary fits model.vocab_size. Training and evaluation read
// token shards, not text, so they need no tokenizer: without one (data.tokenizer empty, or the
// default path missing, as for llm.c shards) there is nothing to check and the log says so. A path
// set to something else that is missing is a UserError.
void check_tokenizer(const Config& config);

// With data.document_masking, the token each document begins at: data.eot_token, or else the
// end-of-document token of data.tokenizer (which mlprep writes after each document); none without
// masking. Masking with neither is a UserError.
std::optional<int64_t> document_start(const Config& config);

// The end-of-document token: data.eot_token when set, else the tokenizer's; none where neither is
// at hand.
std::optional<int64_t> end_of_document_token(const Config& config);

// The bytes of the run's tokenizer file, for its checkpoints to carry; empty when the run has none
// (data.tokenizer empty, or the default path with nothing there).
std::string read_tokenizer_model(const Config& config);

// A global batch (micro_batch x grad_accum x ranks windows) larger than the training windows is a
// UserError: each step would read some windows more than once, and the batch may not fit memory.
void check_batch_fits(const BatchLayout& layout, const std::vector<RunSource>& sources);

}  // namespace mltrain
