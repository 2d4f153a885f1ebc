#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "common/directory_lock.h"

namespace mltrain {

// Where mlprep writes a corpus. The shards and the tokenizer are written into a staging directory
// inside it, and publish() moves them into place once the corpus is complete, so that a run that
// fails or is killed before leaves the directory as it was: a new directory it made is removed
// again, and a killed run's staging directory goes with the next run. A non-empty directory is
// refused (a UserError) unless `overwrite`; then publish() moves the new files over mlprep's
// earlier ones (shards, tokenizer, their temporaries) and removes those it did not replace. Files
// that are not mlprep's are never touched. A directory another mlprep is writing into is refused (a
// DirectoryLock on --out/.mlprep.lock, removed again when the run ends).
//
// The moves are many renames, which a kill can split: publish() first writes a marker,
// --out/.mlprep-publishing, that names the staging directory and the new corpus's files, and
// removes it once done. While it is there mltrain refuses to read the half-replaced corpus
// (refuse_half_replaced_corpus), and the next CorpusOutput of the directory finishes the moves.
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
  // Moves what was written into the directory. `after_each_move` is called after each file's
  // move: the tests' seam for a kill in the middle.
  void publish(const std::function<void()>& after_each_move = {});

 private:
  // Finishes the moves of a publish that a kill interrupted, which its marker names.
  void finish_killed_publish();

  std::filesystem::path directory_;
  DirectoryLock lock_;  // first in, last out: it removes a directory it made, once empty again
  std::filesystem::path write_directory_;
  bool publishing_ = false;
  bool published_ = false;
};

// Whether a file name is one that mlprep writes: a shard, a loss mask, the tokenizer, the corpus
// description, or a temporary of one.
bool is_mlprep_file_name(const std::string& name);

// A UserError, saying how to mend it, where `directory` holds a corpus that a killed mlprep
// --overwrite left half replaced.
void refuse_half_replaced_corpus(const std::filesystem::path& directory);

}  // namespace mltrain
