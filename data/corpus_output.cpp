#include "data/corpus_output.h"

#include <unistd.h>

#include <fmt/format.h>

#include <regex>
#include <set>
#include <string>
#include <system_error>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_tree.h"

namespace mltrain {
namespace {

// Staging directories are named for the process; one left by a killed run is removed by the next,
// which holds the lock.
constexpr std::string_view kStagingPrefix = ".mlprep-staging-";

UserError cannot(const char* what, const std::filesystem::path& path,
                 const std::error_code& error) {
  return UserError(fmt::format("--out {}: cannot {}: {}", path.string(), what, error.message()));
}

}  // namespace

bool is_mlprep_file_name(const std::string& name) {
  static const std::regex kName(R"(((train|val)_\d{6,}\.bin|tokenizer\.model)(\.tmp\.\d+)?)");
  return std::regex_match(name, kName);
}

CorpusOutput::CorpusOutput(std::filesystem::path directory, bool overwrite)
    : directory_(std::move(directory)),
      lock_(directory_, {.lock_file = ".mlprep.lock",
                         .owner = "mlprep",
                         .setting = "--out",
                         .keep_lock_file = false}) {
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

void CorpusOutput::publish() {
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
  // From here a failure keeps the staging directory: it holds what was not moved yet.
  publishing_ = true;
  try {
    for (const std::string& name : staged)
      std::filesystem::rename(write_directory_ / name, directory_ / name);  // replaces at once
    for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && is_mlprep_file_name(name) && !staged.contains(name))
        std::filesystem::remove(entry.path());
    }
  } catch (const std::filesystem::filesystem_error& error) {
    throw UserError(fmt::format(
        "--out {}: replacing the earlier corpus failed ({}); the new files not moved yet are in {}",
        directory_.string(), error.what(), write_directory_.string()));
  }
  remove_tree(write_directory_);
  published_ = true;
  fsync_directory(directory_);
}

}  // namespace mltrain
