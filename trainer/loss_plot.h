#pragma once

#include <filesystem>

namespace mltrain {

// Draws RUN_DIR/loss.png (training loss per step and validation loss) from the latest run in
// RUN_DIR/metrics.jsonl with gnuplot. Without gnuplot on the PATH it says so and draws nothing;
// a plot is a convenience, never a reason for a run to fail.
void draw_loss_curve(const std::filesystem::path& run_dir);

}  // namespace mltrain
