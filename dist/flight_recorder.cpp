#include "dist/flight_recorder.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/atomic_file.h"
#include "common/input_file.h"

namespace mltrain {
namespace {

using namespace std::chrono_literals;

// How often a rank looks for another rank's request, and for the records it waits for: the
// request is one stat of a missing file on a shared filesystem.
constexpr auto kRequestPoll = 200ms;
constexpr auto kRecordPoll = 50ms;
// How much longer than the peer wait a later failure waits for the first one's gathering.
constexpr auto kGatheringMargin = 10s;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Asks every rank for its record, unless another rank has asked first: the request is made whole
// under a name of this rank's, then linked into place, which fails where one is already there
// (ranks on different nodes may have the same process id, so the temporary names of
// write_file_atomically could meet).
void ask_for_records(const std::filesystem::path& directory, const FlightRequest& request) {
  const std::filesystem::path own = directory / fmt::format("dump_requested.rank_{}", request.rank);
  write_file_atomically(own, flight_request_json(request));
  std::error_code linked;
  std::filesystem::create_hard_link(own, flight_request_path(directory), linked);
  if (linked && linked != std::errc::file_exists) {
    // A filesystem without hard links: a request that replaces another's asks all the same.
    std::filesystem::rename(own, flight_request_path(directory));
    return;
  }
  std::filesystem::remove(own, linked);
}

}  // namespace

FlightRecorder::FlightRecorder(int rank, int world_size, std::chrono::duration<double> peer_wait)
    : rank_(rank), world_size_(world_size), peer_wait_(peer_wait), ring_(kCapacity) {}

FlightRecorder::~FlightRecorder() {
  {
    std::lock_guard lock(thread_mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t FlightRecorder::enqueued(std::string_view op, int64_t numel, c10::ScalarType dtype,
                                 int bucket) {
  const int64_t enqueued_us = now_us();
  std::lock_guard lock(mutex_);
  const int64_t seq = next_seq_++;
  ring_[static_cast<size_t>(seq) % kCapacity] = {
      .seq = seq,
      .op = std::string(op),
      .numel = numel,
      .bytes = numel * static_cast<int64_t>(c10::elementSize(dtype)),
      .dtype = c10::toString(dtype),
      .bucket = bucket,
      .step = step_,
      .enqueued_us = enqueued_us};
  return seq;
}

FlightEntry* FlightRecorder::kept(int64_t seq) {
  FlightEntry& entry = ring_[static_cast<size_t>(seq) % kCapacity];
  return entry.seq == seq ? &entry : nullptr;
}

void FlightRecorder::started(int64_t seq) {
  const int64_t time = now_us();
  std::lock_guard lock(mutex_);
  // The first mark stands: a backend that hands a collective to another thread marks it started
  // before that thread can see it complete.
  FlightEntry* entry = kept(seq);
  if (entry != nullptr && entry->started_us == 0) entry->started_us = time;
}

void FlightRecorder::completed(int64_t seq) {
  const int64_t time = now_us();
  std::lock_guard lock(mutex_);
  if (FlightEntry* entry = kept(seq)) entry->completed_us = time;
}

void FlightRecorder::set_step(int64_t step) {
  std::lock_guard lock(mutex_);
  step_ = step;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard lock(mutex_);
  std::vector<FlightEntry> entries;
  const int64_t first = std::max<int64_t>(1, next_seq_ - static_cast<int64_t>(kCapacity));
  for (int64_t seq = first; seq < next_seq_; ++seq)
    entries.push_back(ring_[static_cast<size_t>(seq) % kCapacity]);
  return entries;
}

void FlightRecorder::write_records_to(std::filesystem::path directory) {
  std::filesystem::create_directories(directory);
  {
    std::lock_guard lock(mutex_);
    if (!directory_.empty()) throw std::logic_error("FlightRecorder::write_records_to twice");
    directory_ = std::move(directory);
  }
  thread_ = std::thread([this] { answer_requests(); });
}

int64_t FlightRecorder::last_seq() const {
  std::lock_guard lock(mutex_);
  return next_seq_ - 1;
}

std::filesystem::path FlightRecorder::directory() const {
  std::lock_guard lock(mutex_);
  return directory_;
}

void FlightRecorder::write_record(const std::string& reason, int64_t failed_seq) {
  std::lock_guard lock(write_mutex_);
  if (failure_written_ && failed_seq < 0) return;
  const FlightRecord record{.rank = rank_,
                            .world_size = world_size_,
                            .reason = reason,
                            .failed_seq = failed_seq,
                            .written_us = now_us(),
                            .entries = entries()};
  write_file_atomically(flight_record_path(directory(), rank_), flight_record_json(record));
  if (failed_seq > 0) failure_written_ = true;
}

void FlightRecorder::answer_requests() {
  const std::filesystem::path request = flight_request_path(directory());
  std::unique_lock lock(thread_mutex_);
  while (!stop_.wait_for(lock, kRequestPoll, [this] { return stopping_; })) {
    std::error_code missing;
    if (!std::filesystem::exists(request, missing)) continue;
    lock.unlock();
    try {
      const std::optional<FlightRequest> asked = read_flight_request(request.parent_path());
      write_record(asked ? fmt::format("written when rank {} failed at collective #{}", asked->rank,
                                       asked->seq)
                         : "written when another rank failed",
                   -1);
    } catch (const std::exception& error) {
      spdlog::warn("rank {} could not write its flight record: {}", rank_, error.what());
    }
    return;
  }
}

std::string FlightRecorder::explain_failure(int64_t seq, const std::string& failure) {
  int64_t step = 0;
  {
    std::lock_guard lock(mutex_);
    const FlightEntry* entry = kept(seq);
    step = entry != nullptr ? entry->step : step_;
  }
  const std::string message = fmt::format("{} [collective #{} of step {}]", failure, seq, step);
  if (directory().empty()) return message;
  {
    std::unique_lock lock(gather_mutex_);
    if (gathering_ != Gathering::not_yet) {
      // Bounded all the same: the first gathering's file work may hang on a failing filesystem.
      gathered_.wait_for(lock, peer_wait_ + kGatheringMargin,
                         [this] { return gathering_ == Gathering::done; });
      if (gathering_ != Gathering::done) return message;
      return gathered_seq_ == seq
                 ? fmt::format("{}; {}", message, ranks_behind_)
                 : fmt::format("{}; at collective #{}, where this rank failed first, {}", message,
                               gathered_seq_, ranks_behind_);
    }
    gathering_ = Gathering::running;
  }
  std::string ranks_behind = gather(seq, failure);
  {
    std::lock_guard lock(gather_mutex_);
    gathering_ = Gathering::done;
    gathered_seq_ = seq;
    ranks_behind_ = ranks_behind;
  }
  gathered_.notify_all();
  return fmt::format("{}; {}", message, ranks_behind);
}

std::string FlightRecorder::gather(int64_t seq, const std::string& failure) {
  const std::filesystem::path directory = this->directory();
  try {
    write_record(failure, seq);
    ask_for_records(directory, {.rank = rank_, .seq = seq});
    const auto deadline = std::chrono::steady_clock::now() + peer_wait_;
    std::error_code missing;
    for (int waiting_for = 0; waiting_for < world_size_;) {
      if (std::filesystem::exists(flight_record_path(directory, waiting_for), missing)) {
        ++waiting_for;
      } else if (std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(kRecordPoll);
      } else {
        break;
      }
    }
    return fmt::format("{}; every rank's record: mltrain --flight-report {}",
                       describe_ranks_behind(read_flight_records(directory), world_size_, seq),
                       directory.parent_path().string());
  } catch (const std::exception& error) {
    return fmt::format("the ranks' flight records could not be gathered: {}", error.what());
  }
}

}  // namespace mltrain
