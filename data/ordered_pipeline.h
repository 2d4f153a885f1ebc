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
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::pair<int64_t, Item>> made;  // waiting for a worker
  std::map<int64_t, Item> transformed;        // waiting for their turn to be consumed
  int64_t in_flight = 0;
  int64_t made_count = 0;
  bool all_made = false;
  bool stopping = false;
  std::exception_ptr error;

  const auto fail = [&] {
    const std::lock_guard lock(mutex);
    if (!error) error = std::current_exception();
    stopping = true;
    changed.notify_all();
  };

  // Threads are started inside the try below: one that cannot start stops those that did.
  std::thread producer;
  std::vector<std::thread> pool;
  const auto run_producer = [&] {
    try {
      while (true) {
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return stopping || in_flight < max_in_flight; });
          if (stopping) return;
        }
        std::optional<Item> item = produce();
        const std::lock_guard lock(mutex);
        if (!item) {
          all_made = true;
          changed.notify_all();
          return;
        }
        made.emplace_back(made_count++, std::move(*item));
        ++in_flight;
        changed.notify_all();
      }
    } catch (...) {
      fail();
    }
  };
  const auto run_worker = [&] {
    try {
      while (true) {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stopping || !made.empty() || all_made; });
        if (stopping || made.empty()) return;  // stopped, or everything made is taken
        auto [index, item] = std::move(made.front());
        made.pop_front();
        lock.unlock();
        transform(item);
        lock.lock();
        transformed.emplace(index, std::move(item));
        changed.notify_all();
      }
    } catch (...) {
      fail();
    }
  };

  try {
    producer = std::thread(run_producer);
    for (int w = 0; w < workers; ++w) pool.emplace_back(run_worker);
    for (int64_t next = 0;; ++next) {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] {
        return stopping || transformed.contains(next) || (all_made && next == made_count);
      });
      if (stopping || !transformed.contains(next)) break;
      Item item = std::move(transformed.extract(next).mapped());
      lock.unlock();
      consume(item);
      lock.lock();
      --in_flight;
      changed.notify_all();
    }
  } catch (...) {
    fail();
  }
  {
    const std::lock_guard lock(mutex);
    stopping = true;
    changed.notify_all();
  }
  if (producer.joinable()) producer.join();
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mltrain
