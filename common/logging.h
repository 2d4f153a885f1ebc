#pragma once

namespace mltrain {

// Sets up the process-wide spdlog logger: rank 0 prints progress at info level; other ranks print
// only warnings and errors, tagged with their rank, so a multi-rank log stays readable.
void setup_logging(int rank);

}  // namespace mltrain
