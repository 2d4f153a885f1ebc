#include "dist/flight_record.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/input_file.h"
#include "dist/world.h"

namespace mltrain {
namespace {

using nlohmann::json;

// The ranks listed one by one in a line; past them, how many more.
constexpr size_t kRanksNamed = 8;

// The longest op or dtype name a record may give: each is one short word in a line of the report.
constexpr size_t kLongestName = 64;

// Field `name` of `object`, an integer from `min` to `max`. nlohmann's get<int> would wrap a
// number too large for it (rank 4294967296 reads as rank 0) and cast a fraction.
int64_t integer(const json& object, const char* name, int64_t min, int64_t max) {
  const json& value = object.at(name);
  // Past int64_t only as an unsigned number, which is then out of range all the same.
  const bool fits =
      value.is_number_integer() &&
      (!value.is_number_unsigned() || value.get<uint64_t>() <= static_cast<uint64_t>(max));
  const int64_t number = fits ? value.get<int64_t>() : 0;
  if (!fits || number < min || number > max)
    throw UserError(
        fmt::format("{} is {}: must be an integer from {} to {}", name, value.dump(), min, max));
  return number;
}

constexpr int64_t kMostInt64 = std::numeric_limits<int64_t>::max();

// An op or a dtype: one short word, printed as it is.
std::string name_of(const json& object, const char* name) {
  const std::string text = object.at(name).get<std::string>();
  if (text.empty() || text.size() > kLongestName ||
      std::any_of(text.begin(), text.end(), [](unsigned char c) { return c < ' ' || c == 127; }))
    throw UserError(fmt::format("{} is {}: not the name of one", name, object.at(name).dump()));
  return text;
}

// A time of 0 (not yet) is null in the file.
json time_json(int64_t us) { return us == 0 ? json(nullptr) : json(us); }
int64_t time_of(const json& object, const char* name) {
  return object.at(name).is_null() ? 0 : integer(object, name, 0, kMostInt64);
}

json entry_json(const FlightEntry& entry) {
  return {{"seq", entry.seq},
          {"op", entry.op},
          {"numel", entry.numel},
          {"bytes", entry.bytes},
          {"dtype", entry.dtype},
          {"bucket", entry.bucket < 0 ? json(nullptr) : json(entry.bucket)},
          {"step", entry.step},
          {"enqueued_us", time_json(entry.enqueued_us)},
          {"started_us", time_json(entry.started_us)},
          {"completed_us", time_json(entry.completed_us)}};
}

FlightEntry entry_of(const json& value) {
  const int64_t most_bucket = std::numeric_limits<int>::max();
  return {.seq = integer(value, "seq", 1, kMostInt64),
          .op = name_of(value, "op"),
          .numel = integer(value, "numel", 0, kMostInt64),
          .bytes = integer(value, "bytes", 0, kMostInt64),
          .dtype = name_of(value, "dtype"),
          .bucket = value.at("bucket").is_null()
                        ? -1
                        : static_cast<int>(integer(value, "bucket", 0, most_bucket)),
          .step = integer(value, "step", 0, kMostInt64),
          .enqueued_us = time_of(value, "enqueued_us"),
          .started_us = time_of(value, "started_us"),
          .completed_us = time_of(value, "completed_us")};
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Where a rank behind was: its last collective, or why nothing is known.
std::string whereabouts(const std::map<int, FlightRecord>& records, int rank) {
  const auto found = records.find(rank);
  if (found == records.end())
    return "it wrote no flight record (stopped, gone, or not sharing the run directory)";
  if (found->second.entries.empty()) return "it had issued no collective";
  return "its last collective was " + describe(found->second.entries.back());
}

// The oldest collective a rank had not seen complete when it wrote its record.
const FlightEntry* oldest_in_flight(const FlightRecord& record) {
  const auto found = std::find_if(record.entries.begin(), record.entries.end(),
                                  [](const FlightEntry& entry) { return entry.completed_us == 0; });
  return found == record.entries.end() ? nullptr : &*found;
}

// The collective the run stopped at: the earliest one a rank failed at, else (records written
// only when asked) the furthest any rank reached.
int64_t stopped_at(const std::map<int, FlightRecord>& records) {
  int64_t failed = 0;
  int64_t furthest = 0;
  for (const auto& [rank, record] : records) {
    if (record.failed_seq > 0 && (failed == 0 || record.failed_seq < failed))
      failed = record.failed_seq;
    furthest = std::max(furthest, record.last_seq());
  }
  return failed > 0 ? failed : furthest;
}

// The collective numbered `seq`, as the first record that holds it describes it.
std::string describe_seq(const std::map<int, FlightRecord>& records, int64_t seq) {
  for (const auto& [rank, record] : records) {
    for (const FlightEntry& entry : record.entries)
      if (entry.seq == seq) return describe(entry);
  }
  return fmt::format("#{}", seq);
}

std::string rank_line(const FlightRecord& record) {
  if (record.entries.empty()) return fmt::format("rank {}: no collective issued", record.rank);
  std::string line =
      fmt::format("rank {}: last issued {}", record.rank, describe(record.entries.back()));
  if (const FlightEntry* waiting = oldest_in_flight(record)) {
    // At least 0: the system clock may have been set back between the two times.
    line += fmt::format(
        "; in flight for {:.1f} s: {}",
        static_cast<double>(std::max<int64_t>(0, record.written_us - waiting->enqueued_us)) / 1e6,
        describe(*waiting));
  } else {
    line += "; all complete";
  }
  if (record.failed_seq > 0) line += fmt::format("; failed at #{}", record.failed_seq);
  return line;
}

// A request of the run whose records lie beside it: of one of its ranks, and of the collective
// that rank's own record (written before it asked) says it failed at.
void check_request(const FlightRequest& request, const std::map<int, FlightRecord>& records,
                   const std::filesystem::path& directory) {
  const int world_size = records.begin()->second.world_size;
  const std::string path = flight_request_path(directory).string();
  if (request.rank >= world_size) {
    throw UserError(fmt::format(
        "{} is a request of rank {}, and the records in {} are of a run of {} ranks: it is "
        "another run's; keep one run's records and request there",
        path, request.rank, directory.string(), world_size));
  }
  const auto found = records.find(request.rank);
  if (found == records.end()) return;
  const int64_t failed = found->second.failed_seq;
  if (failed != (request.seq > 0 ? request.seq : -1)) {
    throw UserError(fmt::format(
        "{} says rank {} failed at #{}, and {} that it {}: they are two runs'; keep one run's "
        "records and request in {}",
        path, request.rank, request.seq, flight_record_path(directory, request.rank).string(),
        failed > 0 ? fmt::format("failed at #{}", failed) : "was asked for its record",
        directory.string()));
  }
}

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks.front());
  const size_t named = std::min(ranks.size(), kRanksNamed);
  std::string text = "ranks " + fmt::to_string(ranks.front());
  for (size_t i = 1; i + 1 < named; ++i) text += fmt::format(", {}", ranks[i]);
  if (named < ranks.size())
    return text + fmt::format(", {} and {} more", ranks[named - 1], ranks.size() - named);
  return text + fmt::format(" and {}", ranks[named - 1]);
}

std::string describe(const FlightEntry& entry) {
  return fmt::format(
      "#{}, the {} of {} {} values{} (step {})", entry.seq, entry.op, entry.numel, entry.dtype,
      entry.bucket < 0 ? "" : fmt::format(" in bucket {}", entry.bucket), entry.step);
}

std::string flight_record_json(const FlightRecord& record) {
  json entries = json::array();
  for (const FlightEntry& entry : record.entries) entries.push_back(entry_json(entry));
  return json{{"rank", record.rank},
              {"world_size", record.world_size},
              {"reason", record.reason},
              {"failed_seq", record.failed_seq > 0 ? json(record.failed_seq) : json(nullptr)},
              {"written_us", record.written_us},
              {"collectives", std::move(entries)}}
             .dump(1, ' ', false, json::error_handler_t::replace) +
         "\n";
}

FlightRecord parse_flight_record(const std::string& text, const std::string& source) {
  try {
    const json value = json::parse(text);
    const int world_size = static_cast<int>(integer(value, "world_size", 1, kMostRanks));
    FlightRecord record{.rank = static_cast<int>(integer(value, "rank", 0, world_size - 1)),
                        .world_size = world_size,
                        .reason = value.at("reason").get<std::string>(),
                        .failed_seq = value.at("failed_seq").is_null()
                                          ? -1
                                          : integer(value, "failed_seq", 1, kMostInt64),
                        .written_us = integer(value, "written_us", 0, kMostInt64),
                        .entries = {}};
    const json& collectives = value.at("collectives");
    if (!collectives.is_array()) throw UserError("collectives is not a list");
    for (const json& value : collectives) {
      FlightEntry entry = entry_of(value);
      // A rank numbers its collectives in the order it issues them, and keeps them in order.
      if (!record.entries.empty() && entry.seq <= record.entries.back().seq)
        throw UserError(
            fmt::format("collective #{} comes after #{}", entry.seq, record.entries.back().seq));
      record.entries.push_back(std::move(entry));
    }
    // A rank fails at a collective it has issued.
    if (record.failed_seq > record.last_seq())
      throw UserError(fmt::format("failed_seq is {}, past its last collective (#{})",
                                  record.failed_seq, record.last_seq()));
    return record;
  } catch (const std::exception& error) {
    throw UserError(fmt::format("{} is not a flight record: {}", source, first_line(error.what())));
  }
}

std::filesystem::path flight_request_path(const std::filesystem::path& directory) {
  return directory / "dump_requested";
}

std::string flight_request_json(const FlightRequest& request) {
  return json{{"rank", request.rank}, {"seq", request.seq}}.dump() + "\n";
}

std::optional<FlightRequest> read_flight_request(const std::filesystem::path& directory) {
  const std::filesystem::path path = flight_request_path(directory);
  std::error_code missing;
  if (!std::filesystem::exists(path, missing)) return std::nullopt;
  try {
    const json value = json::parse(read_text_file(path, "flight record request"));
    return FlightRequest{.rank = static_cast<int>(integer(value, "rank", 0, kMostRanks - 1)),
                         // 0: the rank failed before it issued any collective.
                         .seq = integer(value, "seq", 0, kMostInt64)};
  } catch (const std::exception& error) {
    throw UserError(fmt::format("{} is not a request for flight records: {}", path.string(),
                                first_line(error.what())));
  }
}

std::filesystem::path flight_record_path(const std::filesystem::path& directory, int rank) {
  return directory / fmt::format("rank_{}.json", rank);
}

std::map<int, FlightRecord> read_flight_records(const std::filesystem::path& directory) {
  std::map<int, FlightRecord> records;
  std::map<int, std::filesystem::path> files;
  std::error_code error;
  for (const auto& file : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = file.path().filename().string();
    if (!name.starts_with("rank_") || !name.ends_with(".json")) continue;
    FlightRecord record =
        parse_flight_record(read_text_file(file.path(), "flight record"), file.path().string());
    if (file.path().filename() != flight_record_path("", record.rank).filename()) {
      throw UserError(fmt::format("{} holds the flight record of rank {}: it was renamed",
                                  file.path().string(), record.rank));
    }
    const int rank = record.rank;
    records.emplace(rank, std::move(record));
    files.emplace(rank, file.path());
  }
  // Every rank of a run writes the run's number of ranks: records that differ are two runs'
  // (copied together, or an earlier run's not moved aside), and read as one they would name the
  // wrong ranks behind.
  for (const auto& [rank, record] : records) {
    const FlightRecord& first = records.begin()->second;
    if (record.world_size != first.world_size) {
      throw UserError(fmt::format(
          "{} is the record of a run of {} ranks and {} of a run of {}: the flight records of "
          "two runs are mixed in {}; keep one run's there",
          files.begin()->second.string(), first.world_size, files.at(rank).string(),
          record.world_size, directory.string()));
    }
  }
  return records;
}

std::vector<int> ranks_behind(const std::map<int, FlightRecord>& records, int world_size,
                              int64_t seq) {
  std::vector<int> behind;
  for (int rank = 0; rank < world_size; ++rank) {
    const auto found = records.find(rank);
    if (found == records.end() || found->second.last_seq() < seq) behind.push_back(rank);
  }
  return behind;
}

std::string describe_ranks_behind(const std::map<int, FlightRecord>& records, int world_size,
                                  int64_t seq) {
  const std::vector<int> behind = ranks_behind(records, world_size, seq);
  if (behind.empty()) return "every rank had issued it";
  if (behind.size() == 1) {
    return fmt::format("rank {} had not reached it: {}", behind.front(),
                       whereabouts(records, behind.front()));
  }
  std::string text = rank_list(behind) + " had not reached it:";
  for (size_t i = 0; i < std::min(behind.size(), kRanksNamed); ++i)
    text += fmt::format("{} rank {}: {}", i == 0 ? "" : ";", behind[i],
                        whereabouts(records, behind[i]));
  return text;
}

std::string flight_report(const std::filesystem::path& run_dir) {
  if (!std::filesystem::is_directory(run_dir))
    throw UserError(
        fmt::format("{} is not a directory: give the run's train.run_dir", run_dir.string()));
  const std::filesystem::path directory =
      std::filesystem::is_directory(run_dir / "flight") ? run_dir / "flight" : run_dir;
  const std::map<int, FlightRecord> records = read_flight_records(directory);
  if (records.empty()) {
    const std::filesystem::path previous = run_dir / "flight.previous";
    throw UserError(fmt::format(
        "{} holds no flight records: the ranks of a multi-rank run write them there when a "
        "collective fails or does not finish within dist.timeout_s{}",
        directory.string(),
        std::filesystem::is_directory(previous)
            ? fmt::format("; an earlier run's are in {} (mltrain --flight-report {})",
                          previous.string(), previous.string())
            : ""));
  }
  const int world_size = records.begin()->second.world_size;  // every record's
  const std::optional<FlightRequest> request = read_flight_request(directory);
  if (request) check_request(*request, records, directory);
  const int64_t seq = request ? request->seq : stopped_at(records);
  std::string report = fmt::format("flight records of {} of {} ranks in {}\n", records.size(),
                                   world_size, directory.string());
  const auto first = request ? records.find(request->rank) : records.end();
  if (first != records.end() && seq > 0 && first->second.failed_seq == seq) {
    report += fmt::format("rank {} failed first, at #{}: {}\n", first->first, seq,
                          first_line(first->second.reason));
  }
  // A line for each record, and for each rank without one while they are few: the report of a
  // large world, most of whose ranks wrote none, stays as long as its records.
  const size_t without = static_cast<size_t>(world_size) - records.size();
  std::vector<int> missing;
  for (int rank = 0; rank < world_size; ++rank) {
    const auto found = records.find(rank);
    if (found != records.end()) {
      report += rank_line(found->second) + "\n";
    } else {
      missing.push_back(rank);
      if (without <= kRanksNamed) report += fmt::format("rank {}: no record\n", rank);
    }
  }
  if (without > kRanksNamed) report += rank_list(missing) + ": no record\n";
  if (seq == 0) {
    return report +
           (request ? fmt::format("rank {} failed before its first collective\n", request->rank)
                    : "no rank had issued a collective\n");
  }
  return report + fmt::format("the run stopped at {}: {}\n", describe_seq(records, seq),
                              describe_ranks_behind(records, world_size, seq));
}

}  // namespace mltrain
