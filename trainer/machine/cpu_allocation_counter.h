#pragma once

#include <cstdint>

namespace mltrain {

// Counts the bytes of the CPU allocator's blocks: how much memory a computation holds (its tensors,
// the buffers its autograd graph saves), for the tests and for a CPU run's peak memory under
// train.cpu_memory allocator, which is what the memory plan counts. While it lives, the CPU
// allocator is a wrapper around the one it found, which it puts back when it ends. It counts only
// blocks allocated while it lives (not tensors that existed before it began) and not memory that
// bypasses the CPU allocator (oneDNN's scratch space, pinned memory). One at a time: a second while
// one lives throws std::logic_error. Allocations from any thread count.
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
  // The most allocated_bytes() has been since it began, or since reset_peak().
  int64_t peak_bytes() const;
  // Starts the peak again from what is allocated now.
  void reset_peak();
};

}  // namespace mltrain
