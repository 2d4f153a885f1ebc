#include "data/corpus_output.h"

#include <unistd.h>

#include <fmt/format.h>

#include <regex>
#include <string>
#include <system_error>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_tree.h"

namespace mltrain {
namespace {

// Staging directories are named for the process; one left by a killed run is removed by the next.
constexpr std::string_view kStagingPrefix = ".mlprep-staging-";

UserError cannot(const char* what, const std::filesystem::path& path,
                 const std::error_code& error) {
  return UserError(fmt::format("--out {}: cannot {}: {}", path.string(), what, error.message()));
}

}  // namespace

bool is_mlprep_file_name(const std::string& name) {
  static const std::regex kName(R"(((train|val)_\d{6}\.bin|tokenizer\.model)(\.tmp\.\d+)?)");
  return std::regex_match(name, kName);
}

CorpusOutput::CorpusOutput(std::filesystem::path directory, bool overwrite)
    : directory_(std::move(directory)), write_directory_(directory_) {
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error) throw cannot("create the directory", directory_, error);
  std::filesystem::directory_iterator entries(directory_, error);
  if (error) throw cannot("list the directory", directory_, error);
  if (entries == std::filesystem::directory_iterator()) return;  // new or empty
  if (!overwrite) {
    throw UserError(fmt::format(
        "--out {}: the directory is not empty; mlprep writes into a new or empty one "
        "(--overwrite replaces the shards and tokenizer in it once the new ones are complete)",
        directory_.string()));
  }
  for (const auto& entry : entries) {
    if (entry.is_directory() && entry.path().filename().string().starts_with(kStagingPrefix))
      remove_tree(entry.path());
  }
  write_directory_ = directory_ / fmt::format("{}{}", kStagingPrefix, ::getpid());
  std::filesystem::create_directory(write_directory_, error);
  if (error) throw cannot("create a staging directory in", directory_, error);
}

CorpusOutput::~CorpusOutput() {
  if (write_directory_ == directory_) return;
  std::error_code ignored;
  remove_tree(write_directory_, ignored);
}

void CorpusOutput::publish() {
  if (write_directory_ == directory_) return;
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    if (entry.is_regular_file() && is_mlprep_file_name(entry.path().filename().string()))
      std::filesystem::remove(entry.path());
  }
  for (const auto& entry : std::filesystem::directory_iterator(write_directory_))
    std::filesystem::rename(entry.path(), directory_ / entry.path().filename());
  remove_tree(write_directory_);
  write_directory_ = directory_;
  fsync_directory(directory_);
}

}  // namespace mltrain
