#pragma once

#include <csignal>
#include <cstddef>
#include <cstdint>

namespace mltrain {

// Reading a file through mmap has a failure that read() has not: when the file shrinks under the
// mapping, touching a page past its new end raises SIGBUS, which kills the process without a
// word. While a MappingReadGuard lives, a SIGBUS on this thread inside its bytes maps zero-filled
// pages over the rest of them, so that the read runs to its end, and faulted() turns true: the
// reader then says which file changed and how. A SIGBUS anywhere else keeps its default action, a
// crash, as without the guard. A guard inside another guards its own bytes until it goes.
class MappingReadGuard {
 public:
  MappingReadGuard(const void* begin, size_t length);
  ~MappingReadGuard();
  MappingReadGuard(const MappingReadGuard&) = delete;
  MappingReadGuard& operator=(const MappingReadGuard&) = delete;

  // Whether a SIGBUS replaced some of the guarded bytes with zeros: what was read is not the file.
  bool faulted() const;

  // What the signal handler reads and writes.
  struct Range {
    uintptr_t begin;
    uintptr_t end;
    volatile sig_atomic_t faulted;
  };

 private:
  Range range_;
  Range* outer_;  // the guard this one is inside, if any
};

}  // namespace mltrain
