#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace mltrain {

namespace detail {

// The state that run_ordered_pipeline's threads share, and what each of them does with it.
template <class Item>
class OrderedPipeline {
 public:
  OrderedPipeline(const std::function<std::optional<Item>()>& produce,
                  const std::function<void(Item&)>& transform,
                  const std::function<void(Item&)>& consume, int max_in_flight)
      : produce_(produce),
        transform_(transform),
        consume_(consume),
        max_in_flight_(max_in_flight) {}

  void run(int workers) {
    // Threads are started inside the try: one that cannot start stops those that did.
    std::thread producer;
    std::vector<std::thread> pool;
    try {
      producer = std::thread([this] { guarded([this] { make_all(); }); });
      for (int w = 0; w < workers; ++w) pool.emplace_back([this] { guarded([this] { work(); }); });
      consume_in_order();
    } catch (...) {
      fail();
    }
    stop();
    if (producer.joinable()) producer.join();
    for (std::thread& thread : pool) thread.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  template <class Body>
  void guarded(Body body) {
    try {
      body();
    } catch (...) {
      fail();
    }
  }

  void fail() {
    const std::lock_guard lock(mutex_);
    if (!error_) error_ = std::current_exception();
    stopping_ = true;
    changed_.notify_all();
  }

  void stop() {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
  }

  // The producer's thread: items, each once there is room for it.
  void make_all() {
    while (true) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || in_flight_ < max_in_flight_; });
        if (stopping_) return;
      }
      std::optional<Item> item = produce_();
      const std::lock_guard lock(mutex_);
      if (!item) {
        all_made_ = true;
        changed_.notify_all();
        return;
      }
      made_.emplace_back(made_count_++, std::move(*item));
      ++in_flight_;
      changed_.notify_all();
    }
  }

  // A worker's thread: transforms what was made, until nothing more is.
  void work() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stopping_ || !made_.empty() || all_made_; });
      if (stopping_ || made_.empty()) return;  // stopped, or everything made is taken
      auto [index, item] = std::move(made_.front());
      made_.pop_front();
      lock.unlock();
      transform_(item);
      lock.lock();
      transformed_.emplace(index, std::move(item));
      changed_.notify_all();
    }
  }

  // The calling thread: each item in the order it was made.
  void consume_in_order() {
    std::unique_lock lock(mutex_);
    for (int64_t next = 0;; ++next) {
      changed_.wait(lock, [&] {
        return stopping_ || transformed_.contains(next) || (all_made_ && next == made_count_);
      });
      if (stopping_ || !transformed_.contains(next)) return;
      Item item = std::move(transformed_.extract(next).mapped());
      lock.unlock();
      consume_(item);
      lock.lock();
      --in_flight_;
      changed_.notify_all();
    }
  }

  const std::function<std::optional<Item>()>& produce_;
  const std::function<void(Item&)>& transform_;
  const std::function<void(Item&)>& consume_;
  const int64_t max_in_flight_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<int64_t, Item>> made_;  // waiting for a worker
  std::map<int64_t, Item> transformed_;        // waiting for their turn to be consumed
  int64_t in_flight_ = 0;                      // made and not yet consumed
  int64_t made_count_ = 0;
  bool all_made_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace detail

// Items made one after another by `produce` (on a thread of its own) are transformed by `workers`
// threads at once and handed to `consume` (on the calling thread) in the order they were made, so
// the result does not depend on the number of workers. At most `max_in_flight` items exist at a
// time, made and not yet consumed: memory stays bounded however many items there are. produce
// returns none at the end. The first exception of any of the three stops the others and is
// rethrown here once every thread has ended. Fewer than one worker or item in flight is an
// std::invalid_argument.
template <class Item>
void run_ordered_pipeline(const std::function<std::optional<Item>()>& produce,
                          const std::function<void(Item&)>& transform,
                          const std::function<void(Item&)>& consume, int workers,
                          int max_in_flight) {
  if (workers < 1 || max_in_flight < 1)
    throw std::invalid_argument("an ordered pipeline needs a worker and room for an item");
  detail::OrderedPipeline<Item>(produce, transform, consume, max_in_flight).run(workers);
}

}  // namespace mltrain
