#pragma once

#include <filesystem>

namespace mltrain {

// One owner per run directory. A training run holds RUN_DIR/run.lock for its whole life: an open
// file description lock (fcntl F_OFD_SETLK), which the kernel drops when the process ends, however
// it ends, so that a run killed with -9 leaves no stale lock behind. A second training run on the
// directory is refused before it touches anything, with the holder named (pid, host, start time).
// Readers (--eval-only, --export-hf, mlgen) take no lock and never wait: a checkpoint appears whole
// or not at all (a rename), so there is nothing for them to wait for.
//
// The lock is only as good as the filesystem's locks: local filesystems and NFSv4 (or NFSv3 with
// lockd) keep it across machines; a filesystem without locks is warned about, and the run goes on
// unguarded.
class RunDirectoryLock {
 public:
  // Creates the directory where it is missing and takes the lock. A directory mltrain cannot write,
  // or one another run holds, is a UserError naming the path.
  explicit RunDirectoryLock(const std::filesystem::path& run_dir);
  // Releases the lock. A directory the lock made, which holds nothing else yet (a run that stopped
  // at bad input), goes with it: a failed start leaves nothing behind.
  ~RunDirectoryLock();
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

 private:
  std::filesystem::path run_dir_;
  bool made_directory_ = false;
  int fd_ = -1;
};

}  // namespace mltrain
