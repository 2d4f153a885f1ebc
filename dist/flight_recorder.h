#pragma once

#include <c10/core/ScalarType.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dist/flight_record.h"

namespace mltrain {

// A rank's flight recorder, after PyTorch's: the last collectives this rank issued, kept so that a
// run that hangs or fails in a collective can say which rank was behind and where. The
// communicator records each collective as it is enqueued, started and completed; a failure writes
// every live rank's record to a flight directory (RUN_DIR/flight), and the error line names the
// ranks that had not reached the collective.
//
// How the ranks learn of a failure without a collective (the one that failed): the run directory
// must be one that every rank shares (as resuming from its checkpoints needs), so the first rank
// that fails writes a request there (`dump_requested`), and a thread of every rank, which polls
// for it, writes that rank's record. A rank stopped or gone writes none: its absence names it.
class FlightRecorder {
 public:
  // The collectives kept: tens of steps' worth.
  static constexpr size_t kCapacity = 1024;

  // `peer_wait`: how long a failing rank waits for the other ranks' records before it names the
  // ranks behind.
  FlightRecorder(int rank, int world_size, std::chrono::duration<double> peer_wait);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Records a collective asked for now; returns its number. `bucket` -1: not a gradient bucket.
  int64_t enqueued(std::string_view op, int64_t numel, c10::ScalarType dtype, int bucket = -1);
  // The backend took collective `seq` / the rank saw it complete. A number no longer kept is
  // ignored.
  void started(int64_t seq);
  void completed(int64_t seq);
  // The training step that the collectives from now on belong to.
  void set_step(int64_t step);

  // The collectives kept, oldest first.
  std::vector<FlightEntry> entries() const;

  // From now on failures write records into `directory` (made if missing), and this rank writes
  // its record when another rank's failure asks for it. Unset, a failure only numbers the
  // collective in its message.
  void write_records_to(std::filesystem::path directory);

  // The number of the last collective recorded; 0 if none.
  int64_t last_seq() const;

  // The message for `failure`, this rank's failure at collective `seq`. The rank's first failure
  // writes its record, asks the other ranks for theirs, waits for them (peer_wait at most) and
  // names the ranks that had not reached `seq`; a failure after it, from another thread, waits
  // for that and says the same. Never throws.
  std::string explain_failure(int64_t seq, const std::string& failure);

  // Runs `part`, a part of collective `seq` (its start, or this rank's wait for it), and rethrows
  // what it throws as a std::runtime_error with explain_failure's message.
  template <class Part>
  void explained(int64_t seq, Part&& part) {
    try {
      part();
    } catch (const std::exception& failure) {  // c10::Error (Gloo's) is no std::runtime_error
      throw std::runtime_error(explain_failure(seq, failure.what()));
    }
  }

  // Runs `wait`, this rank's wait for collective `seq`, explained as above; then records the
  // collective complete.
  template <class Wait>
  void wait_for(int64_t seq, Wait&& wait) {
    explained(seq, wait);
    completed(seq);
  }

 private:
  FlightEntry* kept(int64_t seq);  // with mutex_ held; null once overwritten
  std::filesystem::path directory() const;
  // Writes this rank's record, unless the record of its own failure is already written (which a
  // record written when asked must not replace).
  void write_record(const std::string& reason, int64_t failed_seq);
  // What the other ranks' records say of collective `seq`, this rank's first failure: "rank 1 had
  // not reached it: ...", or why it is not known.
  std::string gather(int64_t seq, const std::string& failure);
  void answer_requests();  // the thread's body

  const int rank_;
  const int world_size_;
  const std::chrono::duration<double> peer_wait_;

  mutable std::mutex mutex_;  // guards the entries, the step and the directory
  std::vector<FlightEntry> ring_;
  int64_t next_seq_ = 1;
  int64_t step_ = 0;
  std::filesystem::path directory_;

  // Guards writing this rank's record, and whether that of its own failure is written.
  std::mutex write_mutex_;
  bool failure_written_ = false;

  // The first failure's gathering, which the failures after it wait for and repeat.
  std::mutex gather_mutex_;
  std::condition_variable gathered_;
  enum class Gathering { not_yet, running, done } gathering_ = Gathering::not_yet;
  int64_t gathered_seq_ = 0;
  std::string ranks_behind_;

  std::mutex thread_mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mltrain
