#include "trainer/loss_plot.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace mltrain {

void draw_loss_curve(const std::filesystem::path& run_dir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    spdlog::info("no gnuplot on the PATH: skipping {}", (run_dir / "loss.png").string());
    return;
  }
  // The latest run is what follows the last start event.
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::ostringstream train_points;
  std::ostringstream val_points;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) continue;
    if (record.value("event", "") == "start") {
      train_points.str("");
      val_points.str("");
    } else if (record.contains("loss")) {
      train_points << record["step"].get<int64_t>() << ' ' << record["loss"].get<double>() << '\n';
    } else if (record.contains("val_loss") && record.contains("step")) {
      val_points << record["step"].get<int64_t>() << ' ' << record["val_loss"].get<double>() << '\n';
    }
  }
  const auto train_file = run_dir / "loss_train.dat";
  const auto val_file = run_dir / "loss_val.dat";
  const auto script_file = run_dir / "loss.gnuplot";
  std::ofstream(train_file) << train_points.str();
  std::ofstream(val_file) << val_points.str();
  std::ofstream(script_file) << fmt::format(
      "set terminal pngcairo size 900,540\n"
      "set output '{}'\n"
      "set title 'mltrain: {}'\nset xlabel 'step'\nset ylabel 'loss (nats per token)'\nset grid\n"
      "plot '{}' using 1:2 with lines title 'train', '{}' using 1:2 with linespoints title 'validation'\n",
      (run_dir / "loss.png").string(), run_dir.filename().string(), train_file.string(), val_file.string());
  const int status = std::system(fmt::format("gnuplot '{}' 2>&1", script_file.string()).c_str());
  for (const auto& file : {train_file, val_file, script_file}) std::filesystem::remove(file);
  if (status == 0) {
    spdlog::info("loss curve: {}", (run_dir / "loss.png").string());
  } else {
    spdlog::warn("gnuplot could not draw {}", (run_dir / "loss.png").string());
  }
}

}  // namespace mltrain
