#pragma once

#include <cstdint>

namespace mltrain::testing {

// Counts the bytes of the CPU allocator's blocks, for tests of how much memory a computation holds
// (its tensors, the buffers its autograd graph saves). While it lives, the CPU allocator is a
// wrapper around the one it found, which it puts back when it ends. It counts only blocks allocated
// while it lives (not tensors that existed before it began) and not memory that bypasses the CPU
// allocator (oneDNN's scratch space, pinned memory). One at a time: a second while one lives
// throws std::logic_error. Allocations from any thread count.
//
//   const CpuAllocationCounter counter;
//   const at::Tensor loss = model->loss(tokens, targets);
//   counter.allocated_bytes();  // what the loss and its graph hold
class CpuAllocationCounter {
 public:
  CpuAllocationCounter();
  ~CpuAllocationCounter();
  CpuAllocationCounter(const CpuAllocationCounter&) = delete;
  CpuAllocationCounter& operator=(const CpuAllocationCounter&) = delete;

  // Bytes allocated since it began and not freed yet.
  int64_t allocated_bytes() const;
  // The most allocated_bytes() has been since it began.
  int64_t peak_bytes() const;
};

}  // namespace mltrain::testing
