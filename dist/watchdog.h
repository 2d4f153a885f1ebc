#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mltrain {

// The message for an operation that did not finish within dist.timeout_s, the same from every
// deadline in dist/.
std::string missed_deadline(const std::string& operation, double timeout_s);

// Watches device-side operations that the host does not wait for, as ProcessGroupNCCL's watchdog
// does: a thread polls each watched operation until it is done, and the transport for errors it
// reports on its own (a peer that died, a network that failed). When an operation is still not
// done `timeout` after it was watched, or the transport reports an error, the thread calls
// on_failure once with a message naming the operation and the operation's id (for a transport
// error, the oldest operation's; -1 when none is watched), and watches nothing more. The host is
// thus never blocked on the device without a deadline: a wait that would hang ends with on_failure.
class Watchdog {
 public:
  // An empty string from `transport_error` means no error.
  Watchdog(std::chrono::duration<double> timeout, std::function<std::string()> transport_error,
           std::function<void(const std::string& message, int64_t id)> on_failure,
           std::chrono::milliseconds poll_interval = std::chrono::milliseconds(20));
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches an operation until `done` returns true; `done` is called from the watchdog's thread.
  // `id` is the caller's name for it (a collective's number in the flight record).
  void watch(std::string operation, std::function<bool()> done, int64_t id = -1);
  // Blocks until every watched operation is done, or the watchdog has failed.
  void drain();

 private:
  struct Watched {
    std::string operation;
    std::function<bool()> done;
    std::chrono::steady_clock::time_point deadline;
    int64_t id;
  };

  struct Failure {
    std::string message;  // empty: none
    int64_t id = -1;
  };

  void poll_until_stopped();
  // The failure of one of `watched`, if one has failed; removes those that are done.
  Failure check(std::vector<Watched>& watched);

  const std::chrono::steady_clock::duration timeout_;
  const std::function<std::string()> transport_error_;
  const std::function<void(const std::string&, int64_t)> on_failure_;
  const std::chrono::milliseconds poll_interval_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Watched> watched_;  // in the order they were watched
  bool stopping_ = false;
  bool failed_ = false;
  std::thread thread_;  // last: it starts once the members it uses exist
};

}  // namespace mltrain
