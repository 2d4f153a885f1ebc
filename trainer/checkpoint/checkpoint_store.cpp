#include "trainer/checkpoint/checkpoint_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_tree.h"
#include "common/input_file.h"

namespace mltrain {
namespace {

// `latest` holds one checkpoint's name; anything much longer is not one.
constexpr uint64_t kLatestBytes = 4096;

// A state.json is a few kilobytes: its progress, RNG state and checksums.
constexpr uint64_t kStateBytes = uint64_t{1} << 20;

// Whether `existing` is the checkpoint just written to `written` once more (a save that a kill
// kept from `latest`, saved again by the run resumed from before it): the same state.json, which
// holds the step, the progress, the RNG state and every other file's checksum.
bool same_checkpoint(const std::filesystem::path& written, const std::filesystem::path& existing) {
  try {
    return read_text_file(existing / "state.json", "checkpoint state", kStateBytes) ==
           read_text_file(written / "state.json", "checkpoint state", kStateBytes);
  } catch (const std::exception&) {
    return false;  // none, or unreadable: not a copy of this one
  }
}

// Clears the way for the checkpoint written to `written` at `path`: the same checkpoint is
// replaced, and anything else there (another branch of the run, resumed from an earlier
// checkpoint; something a user put there) is moved to the first free PATH.replaced-N, a name that
// nothing resumes from or prunes, so that a save deletes nothing but a copy of itself.
void make_way(const std::filesystem::path& written, const std::filesystem::path& path) {
  if (same_checkpoint(written, path)) {
    remove_tree(path);
  } else if (const auto aside = move_aside(path)) {
    spdlog::warn(
        "{} was already there (another branch of this run, or something put there): kept as {}",
        path.string(), aside->filename().string());
  }
}

// Rank `rank`'s mark in a checkpoint's temporary directory that its share is written: empty, or
// the reason it could not be. Written atomically, so that rank 0 never reads half a reason.
std::filesystem::path share_mark(const std::filesystem::path& temporary, int rank) {
  return temporary / fmt::format(".share-of-rank-{}", rank);
}

}  // namespace

CheckpointStore::CheckpointStore(const std::filesystem::path& run_dir)
    : directory_(run_dir / "checkpoints") {}

std::filesystem::path CheckpointStore::path_of(int64_t step) const {
  return directory_ / checkpoint_name(step);
}

bool CheckpointStore::exists() const {
  std::error_code error;
  const auto status = std::filesystem::symlink_status(directory_, error);
  if (!std::filesystem::exists(status)) return false;
  if (!std::filesystem::is_directory(std::filesystem::status(directory_, error))) {
    throw UserError(
        fmt::format("{}: not a directory, where the run keeps its checkpoints; move it "
                    "away",
                    directory_.string()));
  }
  return true;
}

void CheckpointStore::prepare_for_saving() const {
  if (!exists()) return;
  // What would fail only at the first save, after the steps before it were trained.
  const std::filesystem::path marker = directory_ / "latest";
  std::error_code error;
  const auto marker_status = std::filesystem::status(marker, error);
  if (std::filesystem::exists(marker_status) && !std::filesystem::is_regular_file(marker_status)) {
    throw UserError(
        fmt::format("{}: not a regular file, where the run names its newest checkpoint; "
                    "move it away",
                    marker.string()));
  }
  if (const auto reason = unwritable_reason(directory_)) {
    throw UserError(fmt::format("{}: cannot write there ({}), where the run saves its checkpoints",
                                directory_.string(), *reason));
  }
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    if (entry.path().extension() == ".tmp") {
      spdlog::warn("removing {}, left by an interrupted checkpoint save", entry.path().string());
      remove_tree(entry.path());
    }
  }
}

std::filesystem::path CheckpointStore::temporary_of(int64_t step) const {
  return directory_ / (checkpoint_name(step) + ".tmp");
}

void CheckpointStore::abandon(int64_t step) const {
  std::error_code ignored;
  remove_tree(temporary_of(step), ignored);
}

void CheckpointStore::give_up(int64_t step, const std::string& reason) const {
  abandon(step);
  throw std::runtime_error(
      fmt::format("saving the checkpoint of step {} failed: {}; the earlier checkpoints are kept",
                  step, reason));
}

void CheckpointStore::begin(const CheckpointContents& contents) const {
  const std::filesystem::path temporary = temporary_of(contents.progress.step);
  try {
    std::filesystem::create_directories(directory_);
    remove_tree(temporary);
    std::filesystem::create_directory(temporary);
    make_tensor_files(temporary, contents);
  } catch (const std::exception& error) {
    give_up(contents.progress.step, error.what());
  }
}

void CheckpointStore::write_share(const CheckpointContents& contents,
                                  const SaveObserver& observe) const {
  const std::filesystem::path temporary = temporary_of(contents.progress.step);
  write_tensor_share(temporary, contents);
  if (observe) observe(SaveMoment::share_written, temporary);
}

void CheckpointStore::mark_share(const CheckpointContents& contents, int rank,
                                 const std::string& failure) const {
  write_file_atomically(share_mark(temporary_of(contents.progress.step), rank), failure);
}

void CheckpointStore::await_shares(const CheckpointContents& contents,
                                   const ShareWait& wait) const {
  const std::filesystem::path temporary = temporary_of(contents.progress.step);
  std::set<int> unmarked;
  for (int rank = 1; rank < contents.writers; ++rank) unmarked.insert(rank);
  std::string failure;
  auto since = std::chrono::steady_clock::now();
  while (!unmarked.empty()) {
    for (auto rank = unmarked.begin(); rank != unmarked.end();) {
      const std::filesystem::path mark = share_mark(temporary, *rank);
      if (!std::filesystem::exists(mark)) {
        ++rank;
        continue;
      }
      const std::string reason = read_text_file(mark, "checkpoint share mark", kStateBytes);
      if (!reason.empty() && failure.empty())
        failure = fmt::format("rank {} could not write its share: {}", *rank, reason);
      std::filesystem::remove(mark);
      rank = unmarked.erase(rank);
      since = std::chrono::steady_clock::now();
    }
    if (unmarked.empty()) break;
    if (wait.abandoned != nullptr && wait.abandoned->load()) {
      throw std::runtime_error(fmt::format("the run ended before rank(s) {} wrote their shares",
                                           fmt::join(unmarked, ", ")));
    }
    if (std::chrono::steady_clock::now() - since > wait.patience) {
      throw std::runtime_error(
          fmt::format("rank(s) {} wrote no share within {} s of the last one (dist.timeout_s)",
                      fmt::join(unmarked, ", "), wait.patience.count()));
    }
    // Marks are files on what may be a shared filesystem: looked for a few times a second, not
    // as fast as a loop can stat them.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!failure.empty()) throw std::runtime_error(failure);
}

std::filesystem::path CheckpointStore::finish(const CheckpointContents& contents,
                                              const SaveObserver& observe,
                                              std::optional<int64_t> keep) const {
  const int64_t step = contents.progress.step;
  const std::filesystem::path final_path = path_of(step);
  const std::filesystem::path temporary = temporary_of(step);
  try {
    complete_checkpoint(temporary, contents, observe);
    fsync_directory(temporary);
    make_way(temporary, final_path);
    std::filesystem::rename(temporary, final_path);
    fsync_directory(directory_);
    if (observe) observe(SaveMoment::renamed, final_path);
    point_latest_at(step);
  } catch (const std::exception& error) {
    give_up(step, error.what());
  }
  prune(step, contents.config.train.keep_last, contents.config.train.keep_every, keep);
  return final_path;
}

void CheckpointStore::point_latest_at(int64_t step) const {
  write_file_atomically(directory_ / "latest", checkpoint_name(step) + "\n");
}

std::filesystem::path CheckpointStore::set_aside(int64_t step,
                                                 std::optional<int64_t> instead) const {
  const bool was_latest = latest_name() == checkpoint_name(step);
  const std::optional<std::filesystem::path> aside = move_aside(path_of(step), "bad");
  if (!aside) {
    throw std::runtime_error(
        fmt::format("{}: not there, to set aside as bad", path_of(step).string()));
  }
  fsync_directory(directory_);
  if (was_latest) {
    if (instead) {
      point_latest_at(*instead);
    } else {
      std::filesystem::remove(directory_ / "latest");
    }
  }
  return *aside;
}

std::vector<int64_t> CheckpointStore::saved_steps() const {
  std::vector<int64_t> steps;
  if (!exists()) return steps;
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    const auto step = checkpoint_step(entry.path().filename().string());
    if (step && entry.is_directory()) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

void CheckpointStore::prune(int64_t saved_step, int64_t keep_last, int64_t keep_every,
                            std::optional<int64_t> keep) const {
  int64_t kept = 0;
  for (const int64_t step : saved_steps()) {
    if (step > saved_step) continue;
    if (kept++ < keep_last || (keep_every > 0 && step % keep_every == 0) || step == keep) continue;
    remove_tree(path_of(step));
  }
}

std::optional<std::string> CheckpointStore::latest_name() const {
  const std::filesystem::path marker = directory_ / "latest";
  std::error_code missing;
  if (!std::filesystem::exists(std::filesystem::symlink_status(marker, missing)))
    return std::nullopt;
  std::string name = read_text_file(marker, "checkpoint pointer", kLatestBytes);
  if (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

std::optional<std::filesystem::path> CheckpointStore::latest() const {
  const std::optional<std::string> named = latest_name();
  if (!named) {
    // A save killed between its rename and `latest`, or `latest` deleted: the checkpoints are
    // complete (only a complete one has its final name), and the newest stands in for the marker.
    const std::vector<int64_t> steps = saved_steps();
    if (steps.empty()) return std::nullopt;
    return path_of(steps.front());
  }
  // Its text is quoted only when it is a checkpoint's name: `latest` may be any file at all.
  const std::string& name = *named;
  const std::filesystem::path marker = directory_ / "latest";
  if (!checkpoint_step(name)) {
    throw UserError(fmt::format(
        "{}: does not name a checkpoint (it should hold one line, such as step_00001000): resume "
        "from a checkpoint directory with --resume PATH",
        marker.string()));
  }
  if (!std::filesystem::is_directory(directory_ / name)) {
    throw UserError(fmt::format(
        "{}: names {}, which is not a checkpoint directory here: resume from a checkpoint "
        "directory with --resume PATH",
        marker.string(), name));
  }
  return directory_ / name;
}

std::optional<std::filesystem::path> CheckpointStore::newest_intact_before(int64_t step) const {
  for (const int64_t older : saved_steps()) {
    if (older >= step) continue;
    try {
      verify_checkpoint(path_of(older));
      return path_of(older);
    } catch (const UserError&) {
    }
  }
  return std::nullopt;
}

std::optional<TrainingProgress> CheckpointStore::resume(const std::string& resume, Llama& model,
                                                        Optimizer& optimizer,
                                                        const Config& config) const {
  if (resume.empty()) {
    if (const std::vector<int64_t> steps = saved_steps(); !steps.empty()) {
      throw UserError(
          fmt::format("{} already holds checkpoints (newest: {}): continue that run with "
                      "--resume auto, or start a new one in another train.run_dir",
                      directory_.parent_path().string(), checkpoint_name(steps.front())));
    }
    return std::nullopt;
  }
  if (resume != "auto") {
    if (!std::filesystem::is_directory(resume)) {
      throw UserError(
          fmt::format("--resume {}: {}", resume,
                      std::filesystem::exists(resume)
                          ? "a file, not a checkpoint directory: give the directory that holds it"
                          : "no such checkpoint directory"));
    }
    return load_checkpoint(resume, model, optimizer, config);
  }
  const auto newest = latest();
  if (!newest) {
    spdlog::info("--resume auto: no checkpoint in the run directory yet; starting fresh");
    return std::nullopt;
  }
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(directory_ / "latest", error))) {
    spdlog::warn("{} is missing: resuming from the newest checkpoint, {}",
                 (directory_ / "latest").string(), newest->filename().string());
  }
  try {
    return load_checkpoint(*newest, model, optimizer, config);
  } catch (const CheckpointMismatch&) {
    throw;  // intact, and so would an older one be: no older checkpoint to point at
  } catch (const UserError& error) {
    const int64_t newest_step = *checkpoint_step(newest->filename().string());
    const auto intact = newest_intact_before(newest_step);
    if (!intact) throw;
    throw UserError(
        fmt::format("{}; the older checkpoint {} is intact: continue from it with --resume {}",
                    error.what(), intact->filename().string(), intact->string()));
  }
}

std::filesystem::path find_weights(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) {
    // A weights file inside a checkpoint is checked against the checkpoint's checksums.
    if (std::filesystem::exists(path.parent_path() / "state.json"))
      verify_checkpoint(path.parent_path());
    return path;
  }
  if (std::filesystem::exists(path / "state.json")) {
    verify_checkpoint(path);
    return path / "model.safetensors";
  }
  if (std::filesystem::exists(path / "model.safetensors")) return path / "model.safetensors";
  if (const auto latest = CheckpointStore(path).latest()) {
    verify_checkpoint(*latest);
    return *latest / "model.safetensors";
  }
  throw UserError(
      fmt::format("{}: no weights here: give a .safetensors file, a checkpoint directory "
                  "or a run directory with checkpoints (train first)",
                  path.string()));
}

std::filesystem::path saved_config_for(const std::filesystem::path& source,
                                       const std::filesystem::path& weights) {
  const std::filesystem::path checkpoint = weights.parent_path();
  if (std::filesystem::exists(checkpoint / "state.json")) return checkpoint / "config.yaml";
  if (std::filesystem::exists(source / "config.yaml")) return source / "config.yaml";
  throw UserError(
      fmt::format("{}: no config is saved with these weights (mltrain's checkpoints have one): "
                  "give the CONFIG.yaml they were trained with",
                  source.string()));
}

std::optional<std::filesystem::path> run_directory_of(const std::filesystem::path& weights) {
  const std::filesystem::path checkpoint =
      std::filesystem::absolute(weights).lexically_normal().parent_path();
  if (!std::filesystem::exists(checkpoint / "state.json") ||
      checkpoint.parent_path().filename() != "checkpoints")
    return std::nullopt;
  return checkpoint.parent_path().parent_path();
}

}  // namespace mltrain
