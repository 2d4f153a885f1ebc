#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mltrain {

// One collective as one rank saw it. Every rank numbers its collectives 1, 2, 3... in the order
// it issues them; as all ranks issue the same collectives in the same order, the same number is
// the same collective on every rank. Times are microseconds of the Unix epoch, 0 for not yet.
struct FlightEntry {
  int64_t seq = 0;
  std::string op;  // all-reduce, reduce-scatter, all-gather, broadcast or sum
  int64_t numel = 0;
  int64_t bytes = 0;
  std::string dtype;
  int bucket = -1;           // the gradient bucket it carries; -1: none
  int64_t step = 0;          // the training step it belongs to; 0: before the first
  int64_t enqueued_us = 0;   // the rank asked for it
  int64_t started_us = 0;    // its backend took it
  int64_t completed_us = 0;  // the rank saw it complete
};

// How messages name an entry: "#57, the all-reduce of 1 Float values (step 3)".
std::string describe(const FlightEntry& entry);

// How messages name several ranks: "rank 1", or "ranks 1, 3 and 4", naming at most 8 and then
// how many more. `ranks` is not empty.
std::string rank_list(const std::vector<int>& ranks);

// What one rank wrote of its last collectives when a collective failed: RUN_DIR/flight/rank_K.json.
struct FlightRecord {
  int rank = 0;
  int world_size = 1;
  std::string reason;       // the failure, or which rank's failure asked for the record
  int64_t failed_seq = -1;  // the collective this rank failed at; -1: written when asked
  int64_t written_us = 0;
  std::vector<FlightEntry> entries;  // oldest first

  // The number of the last collective this rank issued; 0 if none.
  int64_t last_seq() const { return entries.empty() ? 0 : entries.back().seq; }
};

std::string flight_record_json(const FlightRecord& record);
// Throws UserError naming `source` where `text` is not a flight record: where a field is missing
// or out of its range (the world at most kMostRanks, the rank within it, numbers and sizes not
// negative), the collectives are out of order, or the failure is at one it had not issued.
FlightRecord parse_flight_record(const std::string& text, const std::string& source);

// The first failing rank's request for every rank's record: RUN_DIR/flight/dump_requested.
struct FlightRequest {
  int rank = 0;
  int64_t seq = 0;  // the collective it failed at; 0: it failed before its first
};

std::filesystem::path flight_request_path(const std::filesystem::path& directory);
std::string flight_request_json(const FlightRequest& request);
// The request in `directory`, none if there is none; one that is no request is a UserError.
std::optional<FlightRequest> read_flight_request(const std::filesystem::path& directory);

// Where rank `rank` writes its record in a flight directory.
std::filesystem::path flight_record_path(const std::filesystem::path& directory, int rank);

// The records in `directory`, by rank. A file that is not a record is a UserError naming it, and
// so are two records of different numbers of ranks (two runs'), naming both.
std::map<int, FlightRecord> read_flight_records(const std::filesystem::path& directory);

// The ranks among `world_size` that had not reached collective `seq`: those that wrote no record,
// and those whose last collective came before it.
std::vector<int> ranks_behind(const std::map<int, FlightRecord>& records, int world_size,
                              int64_t seq);

// What an error line says of the ranks behind collective `seq`: "rank 1 had not reached it: it
// wrote no flight record (stopped, gone, or not sharing the run directory)", or that every rank
// had issued it (on GPUs, where a rank's host runs ahead of its device, the usual answer).
std::string describe_ranks_behind(const std::map<int, FlightRecord>& records, int world_size,
                                  int64_t seq);

// The picture that `mltrain --flight-report RUN_DIR` prints from RUN_DIR/flight (or from
// `run_dir` itself when it is a flight directory, such as RUN_DIR/flight.previous): the
// collective the run stopped at (the first failure's), where each rank was, and which ranks were
// behind. A directory without records is a UserError saying when they are written, and so is a
// request that is not of the run whose records lie beside it (of a rank outside it, or of a
// failure other than the one its rank's record gives).
std::string flight_report(const std::filesystem::path& run_dir);

}  // namespace mltrain
