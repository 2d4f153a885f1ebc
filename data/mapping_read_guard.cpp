#include "data/mapping_read_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace mltrain {
namespace {

// The guarded range of the thread's read, if it is in one. Only this thread and its own signal
// handler touch it.
thread_local MappingReadGuard::Range* guarded_range = nullptr;

uintptr_t page_size = 0;
struct sigaction previous_action {};

// Runs on the thread whose read faulted. Everything it calls is async-signal-safe (mmap and
// sigaction are plain system calls).
extern "C" void on_bus_error(int signal, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  MappingReadGuard::Range* range = guarded_range;
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  // BUS_ADRERR: a page of the mapping that the file no longer backs.
  if (range != nullptr && info->si_code == BUS_ADRERR && address >= range->begin &&
      address < range->end) {
    // From the start of the faulting page to the end of the range's last page.
    const uintptr_t into_page = address & (page_size - 1);
    char* const first_page = static_cast<char*>(info->si_addr) - into_page;
    const uintptr_t end = (range->end + page_size - 1) & ~(page_size - 1);
    void* zeros = ::mmap(first_page, end - (address - into_page), PROT_READ,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    errno = saved_errno;
    if (zeros != MAP_FAILED) {
      range->faulted = 1;
      return;  // the faulting load runs again, on a zero page
    }
  }
  // Not a guarded read: whatever handled SIGBUS before does, or the default action (a crash) when
  // the faulting instruction runs again.
  if ((previous_action.sa_flags & SA_SIGINFO) != 0 && previous_action.sa_sigaction != nullptr) {
    previous_action.sa_sigaction(signal, info, context);
    return;
  }
  ::sigaction(SIGBUS, &previous_action, nullptr);
}

void install_handler() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction action {};
    action.sa_sigaction = on_bus_error;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &previous_action);
  });
}

}  // namespace

MappingReadGuard::MappingReadGuard(const void* begin, size_t length)
    : range_{reinterpret_cast<uintptr_t>(begin), reinterpret_cast<uintptr_t>(begin) + length, 0},
      outer_(guarded_range) {
  install_handler();
  guarded_range = &range_;
  // The compiler must not move the guarded reads before the guard is set, nor after it is read.
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

MappingReadGuard::~MappingReadGuard() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded_range = outer_;
}

bool MappingReadGuard::faulted() const {
  std::atomic_signal_fence(std::memory_order_seq_cst);
  return range_.faulted != 0;
}

}  // namespace mltrain
