#pragma once

#include <filesystem>
#include <string>

namespace mltrain {

// One owner for a directory that a process writes: a training run's RUN_DIR, mlprep's --out. The
// owner holds a lock on a file in it for its whole life: an open file description lock (fcntl
// F_OFD_SETLK), which the kernel drops when the process ends, however it ends, so that one killed
// with -9 leaves no stale lock behind. A second would-be owner is refused before it touches
// anything, with the holder named (pid, host, start time). Readers take no lock and never wait.
//
// The lock is only as good as the filesystem's locks: local filesystems and NFSv4 (or NFSv3 with
// its lock manager) keep it across machines; where locks are not supported, a warning says so and
// the owner goes on unguarded.
class DirectoryLock {
 public:
  struct Names {
    std::string lock_file;  // in the directory: "run.lock"
    std::string owner;      // what holds it, in messages: "training run"
    std::string setting;    // what names the directory, in messages: "train.run_dir"
    bool keep_lock_file;    // left for the next owner, or removed on release
  };

  // Creates the directory where it is missing, takes the lock, and checks that the directory can
  // be written. A directory that cannot be written, or that another owner holds, is a UserError
  // naming it.
  DirectoryLock(const std::filesystem::path& directory, Names names);
  // Releases the lock. A directory the lock made, which holds nothing else (an owner that stopped
  // at bad input), goes with it: a failed start leaves nothing behind.
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& lock_file() const { return names_.lock_file; }

  // A lock file removed while held (by hand, taken for a stale one) keeps no other owner out: where
  // the directory's lock file is no longer the one held, the lock is taken again, with a warning;
  // where it cannot be (an owner took the directory meanwhile, something else is in its place), a
  // UserError says why. A stat: cheap enough
  // for every training step.
  void keep_held();

 private:
  void take();  // opens the lock file, locks it and writes who holds it
  bool try_lock(const std::filesystem::path& path);
  void check_writable() const;

  std::filesystem::path directory_;
  Names names_;
  bool made_directory_ = false;
  bool locked_ = false;
  int fd_ = -1;
};

}  // namespace mltrain
