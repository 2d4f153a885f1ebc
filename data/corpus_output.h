#pragma once

#include <filesystem>
#include <string>

namespace mltrain {

// Where mlprep writes a corpus. A new or empty directory is written into directly. A non-empty one
// is refused (a UserError) unless `overwrite`; then the new corpus is written into a staging
// directory inside it, and publish() moves it over mlprep's earlier files (shards, tokenizer,
// their temporaries) and removes those it did not replace, so that a run that fails leaves the
// earlier corpus as it was. Files that are not mlprep's are never touched. A staging directory
// left by a killed run goes with the next run that overwrites.
class CorpusOutput {
 public:
  CorpusOutput(std::filesystem::path directory, bool overwrite);
  // Unpublished, the staging directory and what it holds go.
  ~CorpusOutput();
  CorpusOutput(const CorpusOutput&) = delete;
  CorpusOutput& operator=(const CorpusOutput&) = delete;

  // Where the shards and the tokenizer go now.
  const std::filesystem::path& write_directory() const { return write_directory_; }
  // Moves what was written into the directory, if it was staged.
  void publish();

 private:
  std::filesystem::path directory_;
  std::filesystem::path write_directory_;
  bool publishing_ = false;
};

// Whether a file name is one that mlprep writes: a shard, the tokenizer, or a temporary of either.
bool is_mlprep_file_name(const std::string& name);

}  // namespace mltrain
