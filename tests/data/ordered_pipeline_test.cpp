#include "data/ordered_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>

namespace mltrain {
namespace {

// Items that count how many of them are alive at once.
struct Counted {
  static inline std::atomic<int> alive{0};
  static inline std::atomic<int> most_alive{0};
  int64_t value = 0;
  int64_t result = 0;
  bool moved_from = false;

  explicit Counted(int64_t v) : value(v) { arrive(); }
  Counted(Counted&& other) noexcept : value(other.value), result(other.result) {
    other.moved_from = true;
  }
  Counted& operator=(Counted&&) = delete;
  ~Counted() {
    if (!moved_from) --alive;
  }
  static void arrive() {
    const int now = ++alive;
    int most = most_alive.load();
    while (now > most && !most_alive.compare_exchange_weak(most, now)) {
    }
  }
};

TEST(OrderedPipeline, ConsumesInTheOrderMadeWithBoundedItemsInFlight) {
  constexpr int64_t kItems = 2000;
  constexpr int kMaxInFlight = 6;
  int64_t made = 0;
  std::vector<int64_t> consumed;
  run_ordered_pipeline<Counted>(
      [&]() -> std::optional<Counted> {
        if (made == kItems) return std::nullopt;
        return Counted(made++);
      },
      [](Counted& item) {
        // Uneven work, so that items finish out of order.
        std::this_thread::sleep_for(std::chrono::microseconds((item.value * 7919) % 50));
        item.result = item.value * item.value;
      },
      [&](Counted& item) {
        EXPECT_EQ(item.result, item.value * item.value);
        consumed.push_back(item.value);
      },
      /*workers=*/4, kMaxInFlight);
  ASSERT_EQ(consumed.size(), static_cast<size_t>(kItems));
  for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(consumed[i], i);
  // The bound counts items made and not consumed; the one being made and the one being consumed
  // may exist beside them.
  EXPECT_LE(Counted::most_alive.load(), kMaxInFlight + 2);
  EXPECT_EQ(Counted::alive.load(), 0);
}

TEST(OrderedPipeline, AnExceptionAnywhereStopsTheOthersAndReachesTheCaller) {
  for (const char* where : {"produce", "transform", "consume"}) {
    int64_t made = 0;
    const auto fail_at = [&](const char* stage, int64_t value) {
      if (std::string(stage) == where && value == 50) throw std::runtime_error(where);
    };
    try {
      run_ordered_pipeline<int64_t>(
          [&]() -> std::optional<int64_t> {
            fail_at("produce", made);
            return made++;  // endless: only the exception ends it
          },
          [&](int64_t& value) { fail_at("transform", value); },
          [&](int64_t& value) { fail_at("consume", value); }, /*workers=*/3,
          /*max_in_flight=*/8);
      FAIL() << "no exception from " << where;
    } catch (const std::runtime_error& error) {
      EXPECT_STREQ(error.what(), where);
    }
  }
}

TEST(OrderedPipeline, NoWorkerOrNoRoomIsRefusedRatherThanWaitingForever) {
  const auto nothing = []() -> std::optional<int> { return std::nullopt; };
  const auto ignore = [](int&) {};
  EXPECT_THROW(run_ordered_pipeline<int>(nothing, ignore, ignore, 0, 4), std::invalid_argument);
  EXPECT_THROW(run_ordered_pipeline<int>(nothing, ignore, ignore, 2, 0), std::invalid_argument);
}

}  // namespace
}  // namespace mltrain
