// The flight recorder in one process: what it keeps of each collective, its record file, and how a
// failing rank gathers the other ranks' records to name those behind. Several ranks are played by
// several recorders sharing one flight directory, as the ranks of a run share RUN_DIR/flight.
#include "dist/flight_recorder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "common/error.h"
#include "dist/communicator.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::TemporaryDirectory;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A recorder of rank `rank` among `world_size` that has issued collectives 1..count, all complete.
std::unique_ptr<FlightRecorder> recorder_with(int rank, int world_size, int64_t count,
                                              std::chrono::duration<double> peer_wait = 30s) {
  auto recorder = std::make_unique<FlightRecorder>(rank, world_size, peer_wait);
  for (int64_t i = 0; i < count; ++i)
    recorder->completed(recorder->enqueued("all-reduce", 8, at::kFloat));
  return recorder;
}

TEST(FlightRecorder, KeepsEachCollectivesFieldsAndTimes) {
  FlightRecorder recorder(0, 2, 1s);
  recorder.set_step(7);
  const int64_t first = recorder.enqueued("reduce-scatter", 1000, at::kBFloat16, 3);
  recorder.started(first);
  recorder.completed(first);
  recorder.set_step(8);
  const int64_t second = recorder.enqueued("sum", 1, at::kDouble);
  recorder.started(second);

  const std::vector<FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].seq, 1);
  EXPECT_EQ(entries[0].op, "reduce-scatter");
  EXPECT_EQ(entries[0].numel, 1000);
  EXPECT_EQ(entries[0].bytes, 2000);  // bf16: two bytes a value
  EXPECT_EQ(entries[0].dtype, "BFloat16");
  EXPECT_EQ(entries[0].bucket, 3);
  EXPECT_EQ(entries[0].step, 7);
  EXPECT_GT(entries[0].enqueued_us, 0);
  EXPECT_LE(entries[0].enqueued_us, entries[0].started_us);
  EXPECT_LE(entries[0].started_us, entries[0].completed_us);
  EXPECT_EQ(entries[1].seq, 2);
  EXPECT_EQ(entries[1].bytes, 8);
  EXPECT_EQ(entries[1].bucket, -1);
  EXPECT_EQ(entries[1].step, 8);
  EXPECT_GT(entries[1].started_us, 0);
  EXPECT_EQ(entries[1].completed_us, 0) << "not complete yet";
}

TEST(FlightRecorder, KeepsOnlyTheLastCollectives) {
  const int64_t extra = 5;
  const auto recorder =
      recorder_with(0, 1, static_cast<int64_t>(FlightRecorder::kCapacity) + extra);
  const std::vector<FlightEntry> entries = recorder->entries();
  ASSERT_EQ(entries.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(entries.front().seq, extra + 1);
  EXPECT_EQ(entries.back().seq, static_cast<int64_t>(FlightRecorder::kCapacity) + extra);
  recorder->completed(1);  // long overwritten: ignored
  EXPECT_EQ(recorder->entries().front().seq, extra + 1);
}

// The communicator records what the run asks of it, with the gradient bucket, and its wait.
TEST(FlightRecorder, TheCommunicatorRecordsEachCollectiveAndItsCompletion) {
  const auto communicator = make_communicator(World());
  const at::Tensor gradients = at::ones({6});
  communicator->flight().set_step(4);
  const auto work = communicator->all_reduce_average(gradients, 2);
  work->wait();
  communicator->all_reduce_sum(1.0);
  const std::vector<FlightEntry> entries = communicator->flight().entries();
  ASSERT_EQ(entries.size(), 1u) << "a world of one sums nothing: only the tensor is recorded";
  EXPECT_EQ(entries[0].op, "all-reduce");
  EXPECT_EQ(entries[0].numel, 6);
  EXPECT_EQ(entries[0].bytes, 24);
  EXPECT_EQ(entries[0].bucket, 2);
  EXPECT_EQ(entries[0].step, 4);
  EXPECT_GT(entries[0].completed_us, 0);
}

TEST(FlightRecord, ReadsBackWhatItWrites) {
  FlightRecord record{.rank = 1,
                      .world_size = 3,
                      .reason = "the all-reduce of 8 Float values did not finish",
                      .failed_seq = 12,
                      .written_us = 1733400000123456,
                      .entries = {}};
  record.entries.push_back({.seq = 11,
                            .op = "all-gather",
                            .numel = 64,
                            .bytes = 256,
                            .dtype = "Float",
                            .bucket = 0,
                            .step = 2,
                            .enqueued_us = 1733400000000001,
                            .started_us = 1733400000000002,
                            .completed_us = 1733400000000003});
  record.entries.push_back({.seq = 12,
                            .op = "sum",
                            .numel = 1,
                            .bytes = 8,
                            .dtype = "Double",
                            .bucket = -1,
                            .step = 3,
                            .enqueued_us = 1733400000000004,
                            .started_us = 0,
                            .completed_us = 0});
  const FlightRecord read = parse_flight_record(flight_record_json(record), "rank_1.json");
  EXPECT_EQ(read.rank, 1);
  EXPECT_EQ(read.world_size, 3);
  EXPECT_EQ(read.reason, record.reason);
  EXPECT_EQ(read.failed_seq, 12);
  EXPECT_EQ(read.written_us, record.written_us);
  ASSERT_EQ(read.entries.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const FlightEntry& a = read.entries[i];
    const FlightEntry& b = record.entries[i];
    EXPECT_EQ(std::tie(a.seq, a.op, a.numel, a.bytes, a.dtype, a.bucket, a.step, a.enqueued_us,
                       a.started_us, a.completed_us),
              std::tie(b.seq, b.op, b.numel, b.bytes, b.dtype, b.bucket, b.step, b.enqueued_us,
                       b.started_us, b.completed_us));
  }
}

TEST(FlightRecord, AFileThatIsNoRecordIsAUserErrorNamingIt) {
  for (const std::string text : {"not json", R"({"rank": 0})",
                                 R"({"rank": 4, "world_size": 2, "reason": "", "failed_seq": null,
                                     "written_us": 1, "collectives": []})"}) {
    try {
      parse_flight_record(text, "runs/x/flight/rank_0.json");
      ADD_FAILURE() << text;
    } catch (const UserError& error) {
      EXPECT_CONTAINS(std::string(error.what()),
                      "runs/x/flight/rank_0.json is not a flight record");
    }
  }
}

// A record of rank `rank` of 4 holding collectives `seqs`, each a sum at step 3.
FlightRecord record_of(int rank, std::initializer_list<int64_t> seqs) {
  FlightRecord record;
  record.rank = rank;
  record.world_size = 4;
  for (const int64_t seq : seqs) {
    FlightEntry entry;
    entry.seq = seq;
    entry.op = "sum";
    entry.numel = 1;
    entry.dtype = "Double";
    entry.step = 3;
    record.entries.push_back(entry);
  }
  return record;
}

TEST(FlightRecord, TheRanksBehindAreThoseWithoutARecordOrWhoseLastCameBefore) {
  std::map<int, FlightRecord> records{
      {0, record_of(0, {5, 6})}, {2, record_of(2, {4})}, {3, record_of(3, {7})}};
  EXPECT_EQ(ranks_behind(records, 4, 6), (std::vector<int>{1, 2}));
  EXPECT_EQ(ranks_behind(records, 4, 4), (std::vector<int>{1}));
  const std::string text = describe_ranks_behind(records, 4, 6);
  EXPECT_CONTAINS(text, "ranks 1 and 2 had not reached it");
  EXPECT_CONTAINS(text, "rank 1: it wrote no flight record (stopped, gone, or not sharing");
  EXPECT_CONTAINS(text, "rank 2: its last collective was #4, the sum of 1 Double values (step 3)");
  records[1] = record_of(1, {6});
  records[2] = record_of(2, {4, 5, 6});
  EXPECT_EQ(describe_ranks_behind(records, 4, 6), "every rank had issued it");
}

// The failing rank asks; the other rank's thread answers with its record, and the error names it
// as behind with its last collective, without waiting out the peer wait.
TEST(FlightRecorder, AFailureGathersTheOtherRanksRecordsAndNamesThoseBehind) {
  TemporaryDirectory dir;
  const auto failing = recorder_with(0, 2, 5);
  const auto behind = recorder_with(1, 2, 4);
  failing->write_records_to(dir / "flight");
  behind->write_records_to(dir / "flight");

  const auto start = Clock::now();
  const std::string message = failing->explain_failure(5, "the all-reduce timed out");
  EXPECT_LT(seconds_since(start), 10.0) << "the records were all in: no need to wait 30 s";
  EXPECT_CONTAINS(message, "the all-reduce timed out [collective #5 of step 0]");
  EXPECT_CONTAINS(message, "rank 1 had not reached it: its last collective was #4");
  EXPECT_CONTAINS(message, "mltrain --flight-report " + dir.path().string());

  const auto records = read_flight_records(dir / "flight");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records.at(0).failed_seq, 5);
  EXPECT_EQ(records.at(0).entries.size(), 5u);
  EXPECT_EQ(records.at(1).failed_seq, -1) << "written when asked";
  EXPECT_EQ(records.at(1).reason, "written when rank 0 failed at collective #5");
  EXPECT_EQ(records.at(1).last_seq(), 4);
}

TEST(FlightRecorder, ARankThatWritesNoRecordIsNamedAfterThePeerWait) {
  TemporaryDirectory dir;
  const auto failing = recorder_with(1, 3, 9, 0.5s);
  const auto answering = recorder_with(2, 3, 9);
  failing->write_records_to(dir / "flight");
  answering->write_records_to(dir / "flight");
  const auto start = Clock::now();
  const std::string message = failing->explain_failure(9, "stuck");
  EXPECT_GE(seconds_since(start), 0.5);
  EXPECT_CONTAINS(message,
                  "rank 0 had not reached it: it wrote no flight record (stopped, gone, or not "
                  "sharing the run directory)");
  // Only the first failure gathers: a later one says what it found, at once.
  const auto again = Clock::now();
  const std::string second = failing->explain_failure(9, "stuck again");
  EXPECT_LT(seconds_since(again), 0.4);
  EXPECT_CONTAINS(second, "stuck again [collective #9 of step 0]; rank 0 had not reached it");
  const std::string other = failing->explain_failure(8, "another");
  EXPECT_CONTAINS(other,
                  "another [collective #8 of step 0]; at collective #9, where this rank "
                  "failed first, rank 0 had not reached it");
}

// Two threads of one rank that fail together (an NCCL watchdog and a host sum): the second waits
// for the first's gathering and names the same ranks, rather than a bare line.
TEST(FlightRecorder, AFailureDuringTheFirstOnesGatheringWaitsForIt) {
  TemporaryDirectory dir;
  const auto failing = recorder_with(0, 2, 3, 1s);
  failing->write_records_to(dir / "flight");
  std::string first;
  std::thread gathering([&] { first = failing->explain_failure(3, "first"); });
  std::this_thread::sleep_for(0.3s);  // within the first one's peer wait
  const std::string second = failing->explain_failure(3, "second");
  gathering.join();
  EXPECT_CONTAINS(first, "rank 1 had not reached it");
  EXPECT_CONTAINS(second, "second [collective #3 of step 0]; rank 1 had not reached it");
}

// Ranks that fail at once ask once: the first request stands, and the report starts from it. The
// record of a rank's own failure is the one kept, not one written because another rank asked.
TEST(FlightRecorder, TheFirstRequestStands) {
  TemporaryDirectory dir;
  const auto first = recorder_with(0, 2, 4, 0.2s);
  const auto second = recorder_with(1, 2, 5, 0.2s);
  first->write_records_to(dir / "flight");
  second->write_records_to(dir / "flight");
  first->explain_failure(4, "first failed");
  second->explain_failure(5, "second failed");
  const std::optional<FlightRequest> request = read_flight_request(dir / "flight");
  ASSERT_TRUE(request.has_value());
  EXPECT_EQ(request->rank, 0);
  EXPECT_EQ(request->seq, 4);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir / "flight"),
                          std::filesystem::directory_iterator()),
            3)
      << "the request and two records, no temporaries";
  std::this_thread::sleep_for(0.5s);  // the threads' polls have passed
  const auto records = read_flight_records(dir / "flight");
  EXPECT_EQ(records.at(0).reason, "first failed");
  EXPECT_EQ(records.at(1).reason, "second failed");
  EXPECT_EQ(records.at(1).failed_seq, 5);
  const std::string report = flight_report(dir.path());
  EXPECT_CONTAINS(report, "rank 0 failed first, at #4: first failed");
  EXPECT_CONTAINS(report,
                  "the run stopped at #4, the all-reduce of 8 Float values (step 0): "
                  "every rank had issued it");
}

TEST(FlightRecorder, WithoutADirectoryAFailureOnlyNumbersItsCollective) {
  const auto recorder = recorder_with(0, 2, 2);
  recorder->set_step(9);  // the collective's own step is named, not the current one
  EXPECT_EQ(recorder->last_seq(), 2);
  EXPECT_EQ(recorder->explain_failure(2, "the broadcast failed"),
            "the broadcast failed [collective #2 of step 0]");
}

}  // namespace
}  // namespace mltrain
