#include "dist/rendezvous_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include "common/error.h"
#include "dist/flight_record.h"

namespace mltrain {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::string_view kFilePrefix = "file:";

// How often a rank waiting at the rendezvous looks again: two small requests to the store.
constexpr auto kPoll = 20ms;
// How long the rank that serves the store stays, at most, for the others to read why the
// rendezvous was refused.
constexpr auto kLinger = 3s;
// The ranks that did not come are named when there are at most this many ranks (each is one
// look-up at the store); past it they are only counted.
constexpr int kRanksLookedUp = 1024;

// The keys of the meeting, under the store's prefix.
constexpr const char* kCheckedIn = "mltrain/checked_in";  // ranks that came, counted first
constexpr const char* kWorldSize = "mltrain/world_size";  // "SIZE RANK": the first rank's
constexpr const char* kArrived = "mltrain/arrived";       // ranks that agreed and wait
constexpr const char* kRefused = "mltrain/refused";       // why the meeting cannot succeed
constexpr const char* kRefusalSeen = "mltrain/refusal_seen";
std::string rank_key(int rank) { return fmt::format("mltrain/rank/{}", rank); }

// A FileStore's file is a list of records, a key then a value, each a 32-bit length and as many
// bytes, with keys that begin with one of these. A key far longer than any of them is no store's.
constexpr std::array<std::string_view, 4> kStoreKeyPrefixes = {"/", "-/", "cleanup/", "refcount/"};
constexpr uint32_t kLongestStoreKey = 64 << 10;

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string environment_text(const std::string& name) {
  return process_environment(name).value_or("");
}

// Whether torchrun's agent serves the store its ranks meet at (TORCHELASTIC_USE_AGENT_STORE).
bool served_by_torchrun() { return environment_text("TORCHELASTIC_USE_AGENT_STORE") == "True"; }

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// The variables that give a rank its place, for messages that name them.
std::string rank_variable(Launcher launcher) {
  return launcher == Launcher::slurm ? "SLURM_PROCID" : "RANK";
}
std::string size_variable(Launcher launcher) {
  return launcher == Launcher::slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
}

// `count` bytes of `fd` from `offset`; false at the end of the file.
bool read_at(int fd, uint64_t offset, void* out, size_t count) {
  while (count > 0) {
    const ssize_t read = ::pread(fd, out, count, static_cast<off_t>(offset));
    if (read < 0 && errno == EINTR) continue;
    if (read < 0) throw std::runtime_error(fmt::format("cannot read: {}", std::strerror(errno)));
    if (read == 0) return false;
    out = static_cast<char*>(out) + read;
    offset += static_cast<uint64_t>(read);
    count -= static_cast<size_t>(read);
  }
  return true;
}

// What a FileStore's file that is there already holds: what in it is not a store's records, if
// anything, and the values of the meeting's keys (below) that it holds.
struct StoreFile {
  std::optional<std::string> problem;
  std::map<std::string, std::string> meeting;  // by key, without the store's "/"
};

// Reads `fd`, a file of `size` bytes. FileStore itself trusts the file: a length past its end has
// it wait for bytes that never come, with its lock held, so that every rank hangs; a config file
// given by mistake reads so.
StoreFile read_store_file(int fd, uint64_t size) {
  StoreFile file;
  uint64_t offset = 0;
  while (offset < size) {
    const uint64_t record = offset;
    std::string key;
    for (const bool is_key : {true, false}) {
      uint32_t length = 0;
      if (size - offset < sizeof(length) || !read_at(fd, offset, &length, sizeof(length))) {
        file.problem =
            fmt::format("a record at byte {} is cut short at the end of the file", record);
        return file;
      }
      offset += sizeof(length);
      if (length > size - offset) {
        file.problem = fmt::format("the record at byte {} gives a {} of {} bytes, past the end",
                                   record, is_key ? "key" : "value", length);
        return file;
      }
      if (is_key && length > kLongestStoreKey) {
        file.problem = fmt::format("the record at byte {} gives a key of {} bytes", record, length);
        return file;
      }
      // Keys, and the meeting's values (a few digits each), are read; other values skipped.
      const bool wanted = is_key || (key.starts_with("/mltrain/") && length <= 64);
      std::string text(wanted ? length : 0, '\0');
      if (wanted && !read_at(fd, offset, text.data(), length)) {
        file.problem =
            fmt::format("a record at byte {} is cut short at the end of the file", record);
        return file;
      }
      offset += length;
      if (is_key) {
        key = std::move(text);
        if (std::none_of(kStoreKeyPrefixes.begin(), kStoreKeyPrefixes.end(),
                         [&](std::string_view prefix) { return key.starts_with(prefix); })) {
          file.problem =
              fmt::format("the record at byte {} has a key that no store writes", record);
          return file;
        }
      } else if (key.starts_with("-/mltrain/")) {
        file.meeting.erase(key.substr(2));
      } else if (wanted) {
        file.meeting[key.substr(1)] = std::move(text);
      }
    }
  }
  return file;
}

// Whether the meeting in `file` counted every rank it was for: then it was an earlier run's (or
// other ranks', who met without this one), as no rank of a meeting reads the file after it
// checked in, and no meeting is over before every rank has.
bool meeting_over(const StoreFile& file) {
  const auto arrived = file.meeting.find(kArrived);
  const auto world_size = file.meeting.find(kWorldSize);
  if (arrived == file.meeting.end() || world_size == file.meeting.end()) return false;
  int64_t count = 0;
  int size = 0;
  std::from_chars(arrived->second.data(), arrived->second.data() + arrived->second.size(), count);
  std::from_chars(world_size->second.data(), world_size->second.data() + world_size->second.size(),
                  size);
  return size > 0 && count >= size;
}

// A FileStore's file is a regular file (or none yet) in a directory that must be there and
// writable, and, when it is there already, one that holds a store's records (another rank may
// have made it): that is the user's to fix (exit 2), where the store itself would fail later
// with a message of its own, or hang on a file that is no store. Checked with access(), not by
// making a file: ranks that share the directory would race for its name. The file is read under
// the lock that the store's writers take, waiting for it no later than `deadline`.
void check_store_file(const std::string& rendezvous, Clock::time_point deadline, double timeout_s) {
  const std::filesystem::path file =
      std::filesystem::absolute(rendezvous.substr(kFilePrefix.size()));
  const std::filesystem::path directory = file.parent_path();
  std::error_code missing;
  const std::filesystem::file_status status = std::filesystem::status(file, missing);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw UserError(fmt::format(
        "dist.rendezvous {}: {} is not a file (a directory, a pipe or a device): name a file for "
        "the store, new for each run",
        rendezvous, file.string()));
  }
  std::string why;
  if (!std::filesystem::is_directory(directory)) {
    why = "no such directory";
  } else if (::access(directory.c_str(), W_OK) != 0) {
    why = std::strerror(errno);
  } else if (!std::filesystem::exists(status)) {
    return;
  } else {
    const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return;  // gone since: the store makes it anew
    if (fd < 0) {
      throw UserError(fmt::format(
          "dist.rendezvous {}: cannot open {} to read and write it: {}; name a file for the store "
          "that every rank may write, new for each run",
          rendezvous, file.string(), std::strerror(errno)));
    }
    StoreFile store;
    bool locked = false;
    std::string failure;  // an I/O error: the machine's, not the user's
    try {
      while (!(locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0) && Clock::now() < deadline)
        std::this_thread::sleep_for(kPoll);
      if (locked) {
        const off_t size = ::lseek(fd, 0, SEEK_END);
        if (size < 0) throw std::runtime_error(std::strerror(errno));
        store = read_store_file(fd, static_cast<uint64_t>(size));
      }
    } catch (const std::exception& error) {
      failure = error.what();
    }
    ::close(fd);  // and its lock
    if (!failure.empty()) {
      throw std::runtime_error(fmt::format("dist.rendezvous {}: cannot read {}: {}", rendezvous,
                                           file.string(), failure));
    }
    if (!locked) {
      throw UserError(fmt::format(
          "dist.rendezvous {}: another process held a lock on {} for all of dist.timeout_s = {} "
          "s, which the ranks of a run hold for moments: it is another program's file; name a new "
          "file for the store",
          rendezvous, file.string(), timeout_s));
    }
    if (store.problem) {
      throw UserError(fmt::format(
          "dist.rendezvous {}: {} is there already and is not a c10d file store ({}): name a new "
          "file for the store, one no run has used; this file is left as it is",
          rendezvous, file.string(), *store.problem));
    }
    if (meeting_over(store)) {
      throw UserError(fmt::format(
          "dist.rendezvous {}: {} is the store of ranks that met there before this one ({} of {} "
          "ranks): it was left by an earlier run, or given to two runs; name a new file for each "
          "run",
          rendezvous, file.string(), store.meeting.at(kArrived),
          store.meeting.at(kWorldSize).substr(0, store.meeting.at(kWorldSize).find(' '))));
    }
    return;
  }
  throw UserError(fmt::format(
      "dist.rendezvous {}: cannot make the store's file in {}: {}; give a file in a directory "
      "that every rank shares and may write",
      rendezvous, directory.string(), why));
}

// The ranks' meeting at the store. Each rank checks in under its own number, says how many ranks
// its launcher gave it, and waits, no later than the deadline, until every rank has arrived. A
// rank that finds the ranks cannot meet (two of the same number, numbers of ranks that differ, a
// store left by an earlier run) says why at the store, so that every rank ends with the same
// line, rather than the others waiting out dist.timeout_s for a rank that will not come.
class Meeting {
 public:
  // The deadline passed before every rank came.
  struct NotAllCame : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  Meeting(c10d::Store& store, const World& world, std::string where, bool file, bool serving,
          Clock::time_point deadline)
      : store_(store),
        world_(world),
        where_(std::move(where)),
        file_(file),
        serving_(serving),
        deadline_(deadline) {}

  void run() {
    store_.add(kCheckedIn, 1);
    if (store_.add(rank_key(world_.rank), 1) > 1) {
      refuse(fmt::format(
          "another process checked in there as rank {0} before this one: two ranks were "
          "started with {1}={0}{2}",
          world_.rank, rank_variable(world_.launcher), earlier_run()));
    }
    const std::string first = text_of(store_.compareSet(
        kWorldSize, {}, bytes_of(fmt::format("{} {}", world_.size, world_.rank))));
    int first_size = 0;
    int first_rank = 0;
    const auto space = first.find(' ');
    std::from_chars(first.data(), first.data() + first.size(), first_size);
    if (space != std::string::npos)
      std::from_chars(first.data() + space + 1, first.data() + first.size(), first_rank);
    if (first_size != world_.size) {
      refuse(fmt::format(
          "rank {} was started with {}={} and rank {} with {}={}: start every rank with the same "
          "number of ranks{}",
          first_rank, size_variable(world_.launcher), first_size, world_.rank,
          size_variable(world_.launcher), world_.size, earlier_run()));
    }
    store_.add(kArrived, 1);
    int64_t arrived = 0;
    while ((arrived = store_.add(kArrived, 0)) < world_.size) {
      if (store_.check({kRefused})) refused_elsewhere();
      if (Clock::now() > deadline_) throw NotAllCame(not_all_came(arrived));
      std::this_thread::sleep_for(kPoll);
    }
    if (arrived > world_.size) {
      refuse(fmt::format("{} ranks arrived there for a world of {}{}", arrived, world_.size,
                         earlier_run()));
    }
  }

 private:
  std::string prefix() const {
    return fmt::format("rank {} of {}: the rendezvous at {}", world_.rank, world_.size, where_);
  }

  // For a file store, the other cause of keys that are there already.
  std::string earlier_run() const {
    return file_ ? ", or the file was left by an earlier run (name a new file for each run)" : "";
  }

  // Ends the meeting for every rank: the first reason given stands, and is this rank's error.
  [[noreturn]] void refuse(const std::string& reason) {
    const std::string given = text_of(store_.compareSet(kRefused, {}, bytes_of(reason)));
    linger();
    throw UserError(fmt::format("{}: {}", prefix(), given));
  }

  [[noreturn]] void refused_elsewhere() {
    const std::string reason = text_of(store_.get(kRefused));
    store_.add(kRefusalSeen, 1);
    linger();
    throw UserError(fmt::format("{}: {}", prefix(), reason));
  }

  // The rank that serves the store stays until the other ranks that came have read why the
  // meeting ends (a few seconds at most): gone at once, it would leave them a broken connection
  // to report.
  void linger() {
    if (!serving_) return;
    try {
      const auto until = std::min(deadline_, Clock::now() + kLinger);
      while (Clock::now() < until && store_.add(kRefusalSeen, 0) < store_.add(kCheckedIn, 0) - 1)
        std::this_thread::sleep_for(kPoll);
    } catch (const std::exception&) {  // the others' reading is theirs to report
    }
  }

  // "1 of 2 ranks arrived; rank 1 did not (...)".
  std::string not_all_came(int64_t arrived) {
    std::string text = fmt::format("{} of {} ranks arrived", arrived, world_.size);
    if (world_.size > kRanksLookedUp) return text;
    std::vector<int> missing;
    for (int rank = 0; rank < world_.size; ++rank)
      if (!store_.check({rank_key(rank)})) missing.push_back(rank);
    if (missing.empty()) return text;
    return text + fmt::format(
                      "; {} did not come (not started, failed before it, or given another "
                      "dist.rendezvous{})",
                      rank_list(missing), file_ ? "" : " or MASTER_ADDR:MASTER_PORT");
  }

  c10d::Store& store_;
  const World& world_;
  const std::string where_;
  const bool file_;
  const bool serving_;
  const Clock::time_point deadline_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_rendezvous(const World& world,
                                                   const std::string& rendezvous,
                                                   double timeout_s) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
  const Clock::time_point deadline = Clock::now() + timeout;
  const bool file = rendezvous.starts_with(kFilePrefix);
  if (file) check_store_file(rendezvous, deadline, timeout_s);
  // torchrun's agent serves a store at MASTER_ADDR:MASTER_PORT itself, and says so.
  const bool serving = !file && world.rank == 0 && !served_by_torchrun();
  const std::string server = served_by_torchrun() ? "torchrun" : "rank 0";
  const std::string where =
      file ? fmt::format("the file store {}", rendezvous.substr(kFilePrefix.size()))
           : fmt::format("{}:{} (TCP, served by {})", world.rendezvous_host, world.rendezvous_port,
                         server);
  const std::string failed =
      fmt::format("rank {} of {}: the rendezvous at {} failed within dist.timeout_s = {} s",
                  world.rank, world.size, where, timeout_s);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    if (file) {
      store =
          c10::make_intrusive<c10d::FileStore>(rendezvous.substr(kFilePrefix.size()), world.size);
      store->setTimeout(timeout);
    } else {
      c10d::TCPStoreOptions options;
      options.port = static_cast<uint16_t>(world.rendezvous_port);
      options.isServer = serving;
      options.numWorkers = world.size;
      // The meeting below waits for the ranks, and says which did not come.
      options.waitWorkers = false;
      options.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>(world.rendezvous_host, options);
    }
  } catch (const std::exception& error) {
    throw std::runtime_error(
        fmt::format("{}: {}{}", failed,
                    serving || file ? ""
                                    : fmt::format("could not reach the store (is {} started, and "
                                                  "there?): ",
                                                  server),
                    first_line(error.what())));
  }
  // The agent's store outlives a restart of the ranks: each attempt meets under keys of its own.
  if (served_by_torchrun())
    store = c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("mltrain/{}/{}", environment_text("TORCHELASTIC_RUN_ID"),
                    environment_text("TORCHELASTIC_RESTART_COUNT")),
        store);
  try {
    Meeting(*store, world, where, file, serving, deadline).run();
  } catch (const UserError&) {
    throw;
  } catch (const Meeting::NotAllCame& error) {
    throw std::runtime_error(fmt::format("{}: {}", failed, error.what()));
  } catch (const std::exception& error) {
    throw std::runtime_error(fmt::format(
        "{}: {}{}", failed, first_line(error.what()),
        serving || file ? ""
                        : fmt::format(" ({}, which serves the store, may have failed)", server)));
  }
  return store;
}

}  // namespace mltrain
