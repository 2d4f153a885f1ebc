#pragma once

#include <filesystem>

namespace mltrain {

// Draws RUN_DIR/loss.png (training loss per step and validation loss) from the latest run in
// RUN_DIR/metrics.jsonl with gnuplot, replacing the picture at once when it is drawn. Lines that
// are not metrics records (one cut short by a crash, say) are passed over and counted in a
// warning. No metrics to draw, or no gnuplot on the PATH, is a UserError that says what to do;
// gnuplot failing, a runtime error.
void draw_loss_curve(const std::filesystem::path& run_dir);

}  // namespace mltrain
