#include "trainer/report/loss_plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_tree.h"
#include "common/input_file.h"

extern char** environ;

namespace mltrain {
namespace {

// metrics.jsonl grows a few hundred bytes a logged step: millions of steps stay below.
constexpr uint64_t kMaxMetricsBytes = uint64_t{4} << 30;

using Points = std::vector<std::pair<int64_t, double>>;

struct Curves {
  Points train;
  Points val;
  int64_t bad_lines = 0;
  int64_t first_bad_line = 0;
};

// The curves of the latest run. A run starting at step 0 replaces what came before; a resumed run
// (starting at step s) replaces the points after s, which the interrupted run may have logged, as
// does a rollback to step s.
Curves read_curves(const std::filesystem::path& metrics) {
  Curves curves;
  std::istringstream lines(read_text_file(metrics, "metrics file", kMaxMetricsBytes));
  int64_t number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto event = record.is_object() ? record.find("event") : record.end();
    // An --eval-only's record is of no step of the run: no point of either curve.
    if (event != record.end() && *event == "eval_only") continue;
    const auto step = record.is_object() ? record.find("step") : record.end();
    if (record.is_discarded() || !record.is_object() || step == record.end() ||
        !step->is_number_integer()) {
      if (curves.bad_lines++ == 0) curves.first_bad_line = number;
      continue;
    }
    const int64_t at = step->get<int64_t>();
    const auto number_of = [&](const char* key) {
      const auto value = record.find(key);
      return value != record.end() && value->is_number() ? value->get<double>() : NAN;
    };
    if (event != record.end() && (*event == "start" || *event == "rollback")) {
      // A rollback trains the steps after its checkpoint's again, as a resumed run does.
      const double from = *event == "rollback" ? number_of("to_step") : static_cast<double>(at);
      for (Points* points : {&curves.train, &curves.val})
        std::erase_if(*points, [from](const auto& point) { return point.first > from; });
    } else if (record.contains("loss") && !record.contains("skipped")) {
      if (const double loss = number_of("loss"); std::isfinite(loss))
        curves.train.emplace_back(at, loss);
    } else if (record.contains("val_loss")) {
      if (const double loss = number_of("val_loss"); std::isfinite(loss))
        curves.val.emplace_back(at, loss);
    }
  }
  return curves;
}

// Text as a gnuplot string: single quotes, in which a quote is written twice. A line break would
// end the command and start another, so text with control characters is refused.
std::string gnuplot_quoted(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20)
      throw UserError(fmt::format("cannot plot for \"{}\": it holds a control character", text));
    quoted += c == '\'' ? std::string("''") : std::string(1, c);
  }
  return quoted + "'";
}

std::string data_text(const Points& points) {
  std::string text;
  for (const auto& [step, loss] : points) text += fmt::format("{} {}\n", step, loss);
  return text;
}

// Runs gnuplot on `script`, without a shell between: paths are never parsed as commands.
void run_gnuplot(const std::filesystem::path& script) {
  const std::string program = "gnuplot";
  const std::string script_path = script.string();
  std::vector<char*> argv = {const_cast<char*>(program.c_str()),
                             const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ);
  if (spawned == ENOENT) {
    throw UserError(
        "gnuplot is not on the PATH: install it (Debian's gnuplot-nox) to draw loss.png");
  }
  if (spawned != 0)
    throw std::runtime_error(fmt::format("cannot start gnuplot: {}", std::strerror(spawned)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("gnuplot failed (its message is above)");
}

}  // namespace

void draw_loss_curve(const std::filesystem::path& run_dir) {
  const std::filesystem::path metrics = run_dir / "metrics.jsonl";
  if (!std::filesystem::exists(metrics)) {
    throw UserError(fmt::format(
        "{}: no metrics to plot (train first, or point train.run_dir at a run)", metrics.string()));
  }
  const Curves curves = read_curves(metrics);
  if (curves.bad_lines > 0) {
    spdlog::warn("{}: passed over {} line(s) that are not metrics records, the first at line {}",
                 metrics.string(), curves.bad_lines, curves.first_bad_line);
  }
  // Without a finite loss gnuplot has nothing to draw: that is the metrics' fault, not the plot's.
  if (curves.train.empty() && curves.val.empty())
    throw UserError(fmt::format("{}: no finite losses to plot", metrics.string()));

  std::string pattern = (std::filesystem::temp_directory_path() / "mltrain-plot-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error(fmt::format("cannot make a directory in {}: {}",
                                         std::filesystem::temp_directory_path().string(),
                                         std::strerror(errno)));
  const std::filesystem::path work = pattern;
  const std::filesystem::path picture = run_dir / "loss.png";
  const std::filesystem::path drawn = work / "loss.png";
  try {
    write_file_atomically(work / "train.dat", data_text(curves.train));
    write_file_atomically(work / "val.dat", data_text(curves.val));
    write_file_atomically(
        work / "loss.gnuplot",
        fmt::format("set terminal pngcairo size 900,540\nset output {}\n"
                    "set title {}\nset xlabel 'step'\nset ylabel 'loss (nats per token)'\n"
                    "set grid\nplot {} using 1:2 with lines title 'train', {} using 1:2 with "
                    "linespoints title 'validation'\n",
                    gnuplot_quoted(drawn.string()),
                    gnuplot_quoted("mltrain: " + run_dir.filename().string()),
                    gnuplot_quoted((work / "train.dat").string()),
                    gnuplot_quoted((work / "val.dat").string())));
    run_gnuplot(work / "loss.gnuplot");
    // Copied beside the picture, then renamed over it: a viewer never sees half of one.
    write_file_atomically(picture, read_text_file(drawn, "drawn picture", kMaxMetricsBytes));
  } catch (...) {
    std::error_code ignored;
    remove_tree(work, ignored);
    throw;
  }
  remove_tree(work);
  spdlog::info("loss curve: {}", picture.string());
}

}  // namespace mltrain
