#pragma once

#include <filesystem>
#include <string>

#include "common/directory_lock.h"

namespace mltrain {

// Where mlprep writes a corpus. The shards and the tokenizer are written into a staging directory
// inside it, and publish() moves them into place once the corpus is complete, so that a run that
// fails or is killed leaves the directory as it was: a new directory it made is removed again, and
// a killed run's staging directory goes with the next run. A non-empty directory is refused (a
// UserError) unless `overwrite`; then publish() moves the new files over mlprep's earlier ones
// (shards, tokenizer, their temporaries) and removes those it did not replace. Files that are not
// mlprep's are never touched. A directory another mlprep is writing into is refused (a
// DirectoryLock on --out/.mlprep.lock, removed again when the run ends).
class CorpusOutput {
 public:
  CorpusOutput(std::filesystem::path directory, bool overwrite);
  // Unpublished, the staging directory and what it holds go, and the directory too when this run
  // made it and it is empty again.
  ~CorpusOutput();
  CorpusOutput(const CorpusOutput&) = delete;
  CorpusOutput& operator=(const CorpusOutput&) = delete;

  // Where the shards and the tokenizer go until publish().
  const std::filesystem::path& write_directory() const { return write_directory_; }
  // Moves what was written into the directory.
  void publish();

 private:
  std::filesystem::path directory_;
  DirectoryLock lock_;  // first in, last out: it removes a directory it made, once empty again
  std::filesystem::path write_directory_;
  bool publishing_ = false;
  bool published_ = false;
};

// Whether a file name is one that mlprep writes: a shard, the tokenizer, or a temporary of either.
bool is_mlprep_file_name(const std::string& name);

}  // namespace mltrain
