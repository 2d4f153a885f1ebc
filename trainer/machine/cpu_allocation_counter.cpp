#include "trainer/machine/cpu_allocation_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace mltrain {
namespace {

// A block the wrapper handed out: the underlying allocator's block, freed through it, and the
// number of the counter it was allocated under.
struct CountedBlock {
  c10::DataPtr underlying;
  int64_t bytes;
  uint64_t counter;
};

// What the wrapper knows, in one place that outlives every counter: a block's deleter may run
// after its counter ended (a tensor that outlives it), with nothing but the block's address.
struct Ledger {
  std::mutex mutex;
  std::unordered_map<void*, CountedBlock> blocks;
  c10::Allocator* underlying = nullptr;
  uint64_t counter = 0;  // the number of the live counter, or of the last one
  bool counting = false;
  int64_t allocated = 0;
  int64_t peak = 0;
};

Ledger& ledger() {
  static Ledger* const instance = new Ledger;  // never destroyed: blocks are freed at exit too
  return *instance;
}

void free_counted(void* data) {
  c10::DataPtr underlying;  // frees the block when it goes, outside the lock
  Ledger& l = ledger();
  const std::lock_guard lock(l.mutex);
  const auto found = l.blocks.find(data);
  if (found == l.blocks.end()) throw std::logic_error("CpuAllocationCounter: unknown block");
  if (l.counting && found->second.counter == l.counter) l.allocated -= found->second.bytes;
  underlying = std::move(found->second.underlying);
  l.blocks.erase(found);
}

// Allocates from the allocator the counter found and counts what it hands out. Its blocks are
// simple (data and context are the address), so raw_allocate works through it as through the
// default CPU allocator.
class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    Ledger& l = ledger();
    const std::lock_guard lock(l.mutex);
    c10::DataPtr block = l.underlying->allocate(bytes);
    void* const data = block.get();
    if (data == nullptr) return block;  // zero bytes: nothing to count
    const c10::Device device = block.device();
    l.allocated += static_cast<int64_t>(bytes);
    l.peak = std::max(l.peak, l.allocated);
    l.blocks.emplace(data, CountedBlock{std::move(block), static_cast<int64_t>(bytes), l.counter});
    return {data, data, &free_counted, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// One wrapper for the whole process: code that kept the allocator's address still reaches a live
// object after the counter put the previous allocator back.
CountingAllocator& counting_allocator() {
  static CountingAllocator* const instance = new CountingAllocator;
  return *instance;
}

// Above every priority the allocators LibTorch registers; SetCPUAllocator ignores a lower one.
constexpr uint8_t kPriority = std::numeric_limits<uint8_t>::max();

}  // namespace

CpuAllocationCounter::CpuAllocationCounter() {
  Ledger& l = ledger();
  {
    const std::lock_guard lock(l.mutex);
    if (l.counting) throw std::logic_error("a CpuAllocationCounter is already counting");
    l.underlying = c10::GetCPUAllocator();
    l.counting = true;
    ++l.counter;
    l.allocated = 0;
    l.peak = 0;
  }
  c10::SetCPUAllocator(&counting_allocator(), kPriority);
}

CpuAllocationCounter::~CpuAllocationCounter() {
  Ledger& l = ledger();
  c10::Allocator* previous = nullptr;
  {
    const std::lock_guard lock(l.mutex);
    l.counting = false;
    previous = l.underlying;
  }
  c10::SetCPUAllocator(previous, kPriority);
}

int64_t CpuAllocationCounter::allocated_bytes() const {
  Ledger& l = ledger();
  const std::lock_guard lock(l.mutex);
  return l.allocated;
}

int64_t CpuAllocationCounter::peak_bytes() const {
  Ledger& l = ledger();
  const std::lock_guard lock(l.mutex);
  return l.peak;
}

void CpuAllocationCounter::reset_peak() {
  Ledger& l = ledger();
  const std::lock_guard lock(l.mutex);
  l.peak = l.allocated;
}

}  // namespace mltrain
