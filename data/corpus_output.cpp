#include "data/corpus_output.h"

#include <unistd.h>

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <system_error>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_tree.h"
#include "common/input_file.h"

namespace mltrain {
namespace {

// Staging directories are named for the process; one left by a killed run is removed by the next,
// which holds the lock.
constexpr std::string_view kStagingPrefix = ".mlprep-staging-";
// Present while a corpus is moved into place: its staging directory's name, "moving" or, once
// every file is in place, "moved", then one line per file of the new corpus.
constexpr std::string_view kPublishingMarker = ".mlprep-publishing";
constexpr std::string_view kMoving = "moving";
constexpr std::string_view kMoved = "moved";

void write_marker(const std::filesystem::path& directory, const std::string& staging,
                  std::string_view state, const std::set<std::string>& corpus) {
  std::string text = staging + "\n" + std::string(state) + "\n";
  for (const std::string& name : corpus) text += name + "\n";
  write_file_atomically(directory / kPublishingMarker, text);
}

UserError cannot(const char* what, const std::filesystem::path& path,
                 const std::error_code& error) {
  return UserError(fmt::format("--out {}: cannot {}: {}", path.string(), what, error.message()));
}

// Moves what is still staged into `directory` (unless the marker says every file was), then
// removes the earlier corpus's files that are not the new one's, the staging directory and the
// marker: from the marker's writing to its removal, this is what a killed publish leaves for the
// next run to finish. (`after_each_move`: the tests' seam for a kill between two moves.)
void finish_publishing(const std::filesystem::path& directory, const std::string& staging_name,
                       std::string_view state, const std::set<std::string>& corpus,
                       const std::function<void()>& after_each_move = {}) {
  const std::filesystem::path staging = directory / staging_name;
  if (state == kMoving) {
    std::error_code error;
    if (!std::filesystem::is_directory(staging, error)) {
      throw UserError(fmt::format(
          "--out {}: the replacement of its corpus cannot be finished: the new files not moved yet "
          "were in {}, which is gone; prepare the corpus again (remove {}, then mlprep "
          "--overwrite)",
          directory.string(), staging.string(), (directory / kPublishingMarker).string()));
    }
    for (const auto& entry : std::filesystem::directory_iterator(staging)) {
      std::filesystem::rename(entry.path(), directory / entry.path().filename());  // at once
      if (after_each_move) after_each_move();
    }
    write_marker(directory, staging_name, kMoved, corpus);
  }
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && is_mlprep_file_name(name) && !corpus.contains(name))
      std::filesystem::remove(entry.path());
  }
  remove_tree(staging);
  fsync_directory(directory);
  std::filesystem::remove(directory / kPublishingMarker);
  fsync_directory(directory);
}

}  // namespace

void refuse_half_replaced_corpus(const std::filesystem::path& directory) {
  std::error_code error;
  if (std::filesystem::exists(
          std::filesystem::symlink_status(directory / kPublishingMarker, error)))
    throw UserError(fmt::format(
        "{}: an mlprep --overwrite was killed while it replaced the corpus here, which is half "
        "old and half new: run mlprep with --out {} again (it finishes the replacement first, "
        "and says so, before it prepares anything)",
        directory.string(), directory.string()));
}

bool is_mlprep_file_name(const std::string& name) {
  static const std::regex kName(
      R"(((train|val)_\d{6,}\.(bin|mask)|tokenizer\.model|corpus\.json)(\.tmp\.\d+)?)");
  return std::regex_match(name, kName);
}

CorpusOutput::CorpusOutput(std::filesystem::path directory, bool overwrite)
    : directory_(std::move(directory)),
      lock_(directory_, {.lock_file = ".mlprep.lock",
                         .owner = "mlprep",
                         .setting = "--out",
                         .keep_lock_file = false}) {
  finish_killed_publish();
  std::error_code error;
  std::filesystem::directory_iterator entries(directory_, error);
  if (error) throw cannot("list the directory", directory_, error);
  bool empty = true;
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name == lock_.lock_file()) continue;
    // With the lock held, a staging directory is a killed run's.
    if (entry.is_directory() && name.starts_with(kStagingPrefix)) {
      remove_tree(entry.path());
      continue;
    }
    empty = false;
  }
  if (!empty && !overwrite) {
    throw UserError(fmt::format(
        "--out {}: the directory is not empty; mlprep writes into a new or empty one "
        "(--overwrite replaces the shards and tokenizer in it once the new ones are complete)",
        directory_.string()));
  }
  write_directory_ = directory_ / fmt::format("{}{}", kStagingPrefix, ::getpid());
  std::filesystem::create_directory(write_directory_, error);
  if (error) throw cannot("create a staging directory in", directory_, error);
}

CorpusOutput::~CorpusOutput() {
  if (published_ || publishing_) return;
  std::error_code ignored;
  remove_tree(write_directory_, ignored);
}

void CorpusOutput::finish_killed_publish() {
  const std::filesystem::path marker = directory_ / kPublishingMarker;
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(marker, error))) return;
  std::istringstream lines(read_text_file(marker, "mlprep's publishing marker"));
  std::string staging;
  std::string state;
  std::getline(lines, staging);
  std::getline(lines, state);
  std::set<std::string> corpus;
  for (std::string name; std::getline(lines, name);) corpus.insert(name);
  // A marker that names no file would have every earlier file removed: only mlprep's own is read.
  const bool ours = staging.starts_with(kStagingPrefix) && staging.find('/') == std::string::npos &&
                    (state == kMoving || state == kMoved) && !corpus.empty() &&
                    std::all_of(corpus.begin(), corpus.end(), is_mlprep_file_name);
  if (!ours) {
    throw UserError(
        fmt::format("{}: not the marker mlprep writes while it publishes a corpus; move it away",
                    marker.string()));
  }
  spdlog::warn(
      "--out {}: finishing the replacement of the corpus that a killed mlprep began ({} "
      "files)",
      directory_.string(), corpus.size());
  try {
    finish_publishing(directory_, staging, state, corpus);
  } catch (const std::filesystem::filesystem_error& failure) {
    throw UserError(fmt::format("--out {}: finishing the replacement of the corpus failed ({})",
                                directory_.string(), failure.what()));
  }
}

void CorpusOutput::publish(const std::function<void()>& after_each_move) {
  std::set<std::string> staged;
  for (const auto& entry : std::filesystem::directory_iterator(write_directory_))
    staged.insert(entry.path().filename().string());
  // Each staged file goes over a file of its name or into its place: a directory there would stop
  // the moves halfway, so it stops them before the first.
  for (const std::string& name : staged) {
    const auto there = std::filesystem::symlink_status(directory_ / name);
    if (std::filesystem::exists(there) && !std::filesystem::is_regular_file(there)) {
      throw UserError(
          fmt::format("--out {}: {} is in the way of the new corpus's file of that name",
                      directory_.string(), name));
    }
  }
  // From the marker on, the moves are finished by this run or, killed, by the next one; until then
  // the marker keeps mltrain from reading the half-replaced corpus.
  write_marker(directory_, write_directory_.filename().string(), kMoving, staged);
  publishing_ = true;
  try {
    finish_publishing(directory_, write_directory_.filename().string(), kMoving, staged,
                      after_each_move);
  } catch (const std::filesystem::filesystem_error& error) {
    throw UserError(fmt::format(
        "--out {}: replacing the earlier corpus failed ({}); the new files not moved yet are in {}",
        directory_.string(), error.what(), write_directory_.string()));
  }
  published_ = true;
}

}  // namespace mltrain
