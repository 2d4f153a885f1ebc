#pragma once

#include <cstdint>
#include <string_view>

namespace mltrain {

// Failures made on purpose, for the tests that show what a crash, a full disk or a diverging run
// leave behind. The environment variable MLTRAIN_FAULT holds a comma-separated list of:
//   kill-during-checkpoint   SIGKILL once a checkpoint's model file is written, before the rename
//   fail-checkpoint-write    a checkpoint write fails as on a full disk
//   nonfinite-gradients:A-B  gradients of optimizer steps A..B (0-based) are NaN
//   kill-rank-1              rank 1 of a multi-rank run SIGKILLs itself in its third step
//   hang-rank-1              rank 1 of a multi-rank run sleeps for an hour in its third step
// Unset (always, outside tests), nothing happens.
bool fault_injected(std::string_view fault);

// Whether MLTRAIN_FAULT makes the gradients of `step` non-finite.
bool nonfinite_gradients_injected(int64_t step);

}  // namespace mltrain
