// `mltrain --flight-report` over records it did not write: each field is checked against its range
// and against the others, records of two runs are not read as one, and a request that is not of
// the run beside it is refused. Each case is one line and exit 2, at once, where it once looped
// for minutes, printed millions of lines, or reported a collective that never was.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/file_tree.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;
using testing::TemporaryDirectory;

// Every report is given a deadline: a case that once looped must fail, not stall the suite.
CommandResult report(const std::filesystem::path& run_dir) {
  return testing::run_command(
      fmt::format("timeout 30 {}/mltrain --flight-report {}", MLTRAIN_BIN_DIR, run_dir.string()));
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The record that rank `rank` of `world_size` writes, having issued collectives 1 to 3 and failed
// at `failed` ("null": written when asked).
std::string record(int rank, int world_size, const std::string& failed = "null") {
  std::string collectives;
  for (int seq = 1; seq <= 3; ++seq) {
    collectives += fmt::format(
        R"({}{{"seq": {}, "op": "all-reduce", "numel": 8, "bytes": 32, "dtype": "Float",
             "bucket": null, "step": 1, "enqueued_us": 10, "started_us": 11,
             "completed_us": {}}})",
        seq == 1 ? "" : ", ", seq, seq == 3 ? "null" : "12");
  }
  return fmt::format(
      R"({{"rank": {}, "world_size": {}, "reason": "timed out", "failed_seq": {},
          "written_us": 20, "collectives": [{}]}})",
      rank, world_size, failed, collectives);
}

// A run directory whose flight directory holds `files` (name, text).
void write_flight(const TemporaryDirectory& dir,
                  const std::vector<std::pair<std::string, std::string>>& files) {
  remove_tree(dir / "flight");
  std::filesystem::create_directories(dir / "flight");
  for (const auto& [name, text] : files) testing::write_text(dir / "flight" / name, text);
}

void expect_refused(const CommandResult& result, const std::string& message) {
  EXPECT_EQ(result.exit_code, kExitUserError) << result.output;
  EXPECT_CONTAINS(result.output, message);
  EXPECT_EQ(lines(result.output), 1u) << result.output;
}

// The records as they are written read back into a report: the cases below each change one thing.
TEST(FlightReport, RecordsOfOneRunReport) {
  TemporaryDirectory dir;
  write_flight(dir, {{"rank_0.json", record(0, 2, "3")},
                     {"rank_1.json", record(1, 2)},
                     {"dump_requested", R"({"rank": 0, "seq": 3})"}});
  const CommandResult result = report(dir.path());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_CONTAINS(result.output, "rank 0 failed first, at #3: timed out");
  EXPECT_CONTAINS(result.output, "the run stopped at #3, the all-reduce of 8 Float values");
}

// A world of 2147483647 ranks once took minutes, a line for each rank without a record.
TEST(FlightReport, AWorldSizeOutOfRangeIsRefusedAtOnce) {
  TemporaryDirectory dir;
  for (const std::string world : {"2147483647", "4294967298", "0", "-2", "2.5", "\"2\""}) {
    const std::string field = "\"world_size\": 2";
    std::string text = record(0, 2);
    text.replace(text.find(field), field.size(), "\"world_size\": " + world);
    write_flight(dir, {{"rank_0.json", text}});
    const auto start = std::chrono::steady_clock::now();
    const CommandResult result = report(dir.path());
    expect_refused(result, (dir / "flight" / "rank_0.json").string() + " is not a flight record");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << world;
  }
}

// The largest world a record may give, with one record: the ranks without one are one line.
TEST(FlightReport, TheReportOfALargeWorldStaysShort) {
  TemporaryDirectory dir;
  write_flight(dir, {{"rank_5.json", record(5, 1 << 20, "3")}});
  const CommandResult result = report(dir.path());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_LT(lines(result.output), 10u);
  EXPECT_CONTAINS(result.output, "flight records of 1 of 1048576 ranks");
  EXPECT_CONTAINS(result.output, "ranks 0, 1, 2, 3, 4, 6, 7, 8 and 1048567 more: no record");
}

// Fields out of their range, or that disagree with the others in the same record.
TEST(FlightReport, AFieldOutOfRangeOrAtOddsWithTheOthersIsRefused) {
  TemporaryDirectory dir;
  const std::string valid = record(1, 2, "3");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("rank": 1)", R"("rank": 4294967297)"},  // wrapped to 1 by a 32-bit read
      {R"("rank": 1)", R"("rank": -1)"},
      {R"("failed_seq": 3)", R"("failed_seq": 9)"},  // a collective it never issued
      {R"("failed_seq": 3)", R"("failed_seq": -4)"},
      {R"("written_us": 20)", R"("written_us": -20)"},
      {R"("seq": 2)", R"("seq": 7)"},  // out of order: 1, 7, 3
      {R"("seq": 1)", R"("seq": 0)"},
      {R"("numel": 8)", R"("numel": -8)"},
      {R"("bucket": null)", R"("bucket": -7)"},
      {R"("step": 1)", R"("step": 1e300)"},
      {R"("enqueued_us": 10)", R"("enqueued_us": -10)"},
      {R"("op": "all-reduce")", R"("op": "all-reduce\nrank 0: all complete")"},
      {R"("dtype": "Float")", R"("dtype": "")"},
      {R"("collectives": [)", R"("collectives": {"a": [)"},
  };
  for (const auto& [field, replacement] : cases) {
    std::string text = valid;
    const size_t at = text.find(field);
    ASSERT_NE(at, std::string::npos) << field;
    text.replace(at, field.size(), replacement);
    if (field == R"("collectives": [)") text.insert(text.size() - 1, "}");  // the object's end
    write_flight(dir, {{"rank_1.json", text}});
    expect_refused(report(dir.path()),
                   (dir / "flight" / "rank_1.json").string() + " is not a flight record");
  }
}

// Records of two runs, of different numbers of ranks, are not one run's: both files are named.
TEST(FlightReport, RecordsOfRunsOfDifferentSizesAreRefusedNamingBoth) {
  TemporaryDirectory dir;
  write_flight(dir, {{"rank_0.json", record(0, 2, "3")}, {"rank_1.json", record(1, 3)}});
  expect_refused(report(dir.path()),
                 fmt::format("{} is the record of a run of 2 ranks and {} of a run of 3",
                             (dir / "flight" / "rank_0.json").string(),
                             (dir / "flight" / "rank_1.json").string()));
}

// A request of a rank outside the run, of a collective before the first, or of another failure
// than its rank's record gives: another run's request, or none.
TEST(FlightReport, ARequestThatIsNotOfTheRunBesideItIsRefused) {
  TemporaryDirectory dir;
  const std::string request = (dir / "flight" / "dump_requested").string();
  const auto with_request = [&](const std::string& text) {
    write_flight(dir, {{"rank_0.json", record(0, 2, "3")},
                       {"rank_1.json", record(1, 2)},
                       {"dump_requested", text}});
    return report(dir.path());
  };
  expect_refused(with_request(R"({"rank": 99, "seq": -5})"),
                 request + " is not a request for flight records: seq is -5");
  expect_refused(with_request(R"({"rank": 99, "seq": 3})"),
                 request + " is a request of rank 99, and the records in");
  expect_refused(with_request(R"({"rank": 4294967296, "seq": 3})"),
                 request + " is not a request for flight records: rank is 4294967296");
  expect_refused(with_request(R"({"rank": 0, "seq": 2})"),
                 fmt::format("{} says rank 0 failed at #2, and {} that it failed at #3", request,
                             (dir / "flight" / "rank_0.json").string()));
  expect_refused(with_request(R"({"rank": 1, "seq": 3})"),
                 fmt::format("{} says rank 1 failed at #3, and {} that it was asked for its record",
                             request, (dir / "flight" / "rank_1.json").string()));
}

}  // namespace
}  // namespace mltrain
