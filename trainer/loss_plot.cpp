#include "trainer/loss_plot.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

namespace mltrain {

void draw_loss_curve(const std::filesystem::path& run_dir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    spdlog::info("no gnuplot on the PATH: skipping {}", (run_dir / "loss.png").string());
    return;
  }
  // A run starting at step 0 replaces what came before; a resumed run (starting at step s)
  // replaces the points after s, which the interrupted run may have logged.
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::vector<std::pair<int64_t, double>> train_points;
  std::vector<std::pair<int64_t, double>> val_points;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.contains("step")) continue;
    const int64_t step = record["step"].get<int64_t>();
    if (record.value("event", "") == "start") {
      for (auto* points : {&train_points, &val_points}) {
        std::erase_if(*points, [step](const auto& point) { return point.first > step; });
      }
    } else if (record.contains("loss") && !record.contains("skipped")) {
      train_points.emplace_back(step, record["loss"].get<double>());
    } else if (record.contains("val_loss")) {
      val_points.emplace_back(step, record["val_loss"].get<double>());
    }
  }
  const auto train_file = run_dir / "loss_train.dat";
  const auto val_file = run_dir / "loss_val.dat";
  const auto script_file = run_dir / "loss.gnuplot";
  for (const auto& [file, points] :
       {std::pair{train_file, &train_points}, std::pair{val_file, &val_points}}) {
    std::ofstream out(file);
    for (const auto& [step, loss] : *points) out << step << ' ' << loss << '\n';
  }
  std::ofstream(script_file) << fmt::format(
      "set terminal pngcairo size 900,540\n"
      "set output '{}'\n"
      "set title 'mltrain: {}'\nset xlabel 'step'\nset ylabel 'loss (nats per token)'\nset grid\n"
      "plot '{}' using 1:2 with lines title 'train', '{}' using 1:2 with linespoints title "
      "'validation'\n",
      (run_dir / "loss.png").string(), run_dir.filename().string(), train_file.string(),
      val_file.string());
  const int status = std::system(fmt::format("gnuplot '{}' 2>&1", script_file.string()).c_str());
  for (const auto& file : {train_file, val_file, script_file}) std::filesystem::remove(file);
  if (status == 0) {
    spdlog::info("loss curve: {}", (run_dir / "loss.png").string());
  } else {
    spdlog::warn("gnuplot could not draw {}", (run_dir / "loss.png").string());
  }
}

}  // namespace mltrain
