// The watchdog that bounds the device-side waits of the NCCL path, driven here by plain flags in
// place of CUDA events and NCCL's error state.
#include "dist/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Collects the watchdog's one failure.
struct Verdict {
  std::promise<std::string> message;
  std::future<std::string> future = message.get_future();
  std::atomic<int> calls = 0;
  std::atomic<int64_t> id = -2;
  auto callback() {
    return [this](const std::string& failure, int64_t failed_id) {
      if (calls++ != 0) return;
      id = failed_id;
      message.set_value(failure);
    };
  }
};

const auto kNoTransportError = [] { return std::string(); };

TEST(Watchdog, AnOperationPastItsDeadlineFailsNamingIt) {
  Verdict verdict;
  const auto start = Clock::now();
  Watchdog watchdog(0.3s, kNoTransportError, verdict.callback(), 5ms);
  watchdog.watch(
      "a broadcast", [] { return true; }, 6);
  watchdog.watch(
      "the all-reduce of 1024 Float values", [] { return false; }, 7);
  ASSERT_EQ(verdict.future.wait_for(10s), std::future_status::ready) << "it must fire";
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 5.0);
  const std::string message = verdict.future.get();
  EXPECT_CONTAINS(message, "the all-reduce of 1024 Float values");
  EXPECT_CONTAINS(message, "did not finish within dist.timeout_s = 0.3 s");
  EXPECT_EQ(verdict.id, 7);
  watchdog.drain();  // returns at once once failed
  EXPECT_EQ(verdict.calls, 1);
}

TEST(Watchdog, OperationsThatFinishInTimeNeverFail) {
  Verdict verdict;
  std::atomic<bool> first_done = false;
  std::atomic<bool> second_done = false;
  Watchdog watchdog(0.4s, kNoTransportError, verdict.callback(), 5ms);
  watchdog.watch("first", [&] { return first_done.load(); });
  watchdog.watch("second", [&] { return second_done.load(); });
  std::this_thread::sleep_for(0.1s);
  first_done = true;
  second_done = true;
  watchdog.drain();                   // both done
  std::this_thread::sleep_for(0.6s);  // past the deadlines they would have had
  EXPECT_EQ(verdict.calls, 0);
}

TEST(Watchdog, ATransportErrorFailsTheOldestOperationAtOnce) {
  Verdict verdict;
  std::atomic<bool> broken = false;
  Watchdog watchdog(
      100s, [&] { return broken ? std::string("remote process exited") : std::string(); },
      verdict.callback(), 5ms);
  watchdog.watch(
      "a broadcast", [] { return false; }, 3);
  watchdog.watch(
      "the all-reduce of 8 Float values", [] { return false; }, 4);
  broken = true;
  ASSERT_EQ(verdict.future.wait_for(10s), std::future_status::ready);
  const std::string message = verdict.future.get();
  EXPECT_CONTAINS(message, "a broadcast failed: remote process exited");
  EXPECT_CONTAINS(message, "did another rank die?");
  EXPECT_EQ(verdict.id, 3);
}

}  // namespace
}  // namespace mltrain
