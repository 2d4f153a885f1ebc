#include "dist/watchdog.h"

#include <fmt/format.h>

namespace mltrain {

std::string missed_deadline(const std::string& operation, double timeout_s) {
  return fmt::format("{} did not finish within dist.timeout_s = {:g} s: a rank died or hangs",
                     operation, timeout_s);
}

Watchdog::Watchdog(std::chrono::duration<double> timeout,
                   std::function<std::string()> transport_error,
                   std::function<void(const std::string& message, int64_t id)> on_failure,
                   std::chrono::milliseconds poll_interval)
    : timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout)),
      transport_error_(std::move(transport_error)),
      on_failure_(std::move(on_failure)),
      poll_interval_(poll_interval),
      thread_([this] { poll_until_stopped(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::string operation, std::function<bool()> done, int64_t id) {
  {
    std::lock_guard lock(mutex_);
    if (failed_) return;
    watched_.push_back(
        {std::move(operation), std::move(done), std::chrono::steady_clock::now() + timeout_, id});
  }
  changed_.notify_all();
}

void Watchdog::drain() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return watched_.empty() || failed_; });
}

void Watchdog::poll_until_stopped() {
  std::unique_lock lock(mutex_);
  while (!stopping_ && !failed_) {
    // Polled with the lock released, so that watch() never waits for a poll of the device.
    std::vector<Watched> watched = std::move(watched_);
    watched_.clear();
    lock.unlock();
    const Failure failure = check(watched);
    lock.lock();
    watched_.insert(watched_.begin(), std::make_move_iterator(watched.begin()),
                    std::make_move_iterator(watched.end()));
    if (!failure.message.empty()) {
      failed_ = true;
      lock.unlock();
      changed_.notify_all();
      on_failure_(failure.message, failure.id);
      return;
    }
    changed_.notify_all();
    changed_.wait_for(lock, poll_interval_, [this] { return stopping_; });
  }
}

Watchdog::Failure Watchdog::check(std::vector<Watched>& watched) {
  const std::string oldest = watched.empty() ? "the communicator" : watched.front().operation;
  const int64_t oldest_id = watched.empty() ? -1 : watched.front().id;
  std::string error;
  try {
    error = transport_error_();
  } catch (const std::exception& failure) {
    error = failure.what();
  }
  if (!error.empty())
    return {fmt::format("{} failed: {} (did another rank die?)", oldest, error), oldest_id};
  const auto now = std::chrono::steady_clock::now();
  for (auto it = watched.begin(); it != watched.end();) {
    bool done = false;
    try {
      done = it->done();
    } catch (const std::exception& failure) {  // a CUDA error, which stays for the process
      return {fmt::format("{} failed: {}", it->operation, failure.what()), it->id};
    }
    if (done) {
      it = watched.erase(it);
    } else if (now > it->deadline) {
      return {missed_deadline(it->operation, std::chrono::duration<double>(timeout_).count()),
              it->id};
    } else {
      ++it;
    }
  }
  return {};
}

}  // namespace mltrain
