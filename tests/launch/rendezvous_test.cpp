// The rendezvous of ranks started without MPI, given what a user gets wrong: a file for the store
// that is no store (a config file given by mistake), one another program holds locked, one an
// earlier run left; ranks started with different numbers of ranks or the same rank; a blank
// MASTER_ADDR. Each ends every rank at once with one line and exit 2, where it once hung, waited
// out dist.timeout_s, or ended in c10d's words; and a rendezvous that does time out says how many
// ranks came and which did not.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "common/error.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

namespace mltrain {
namespace {

using testing::read_text;
using testing::run_command;
using testing::TemporaryDirectory;
using Clock = std::chrono::steady_clock;

constexpr const char* kMltrain = MLTRAIN_BIN_DIR "/mltrain";

// Long next to how soon each case below ends: a rank that waits it out has not been told.
constexpr int kTimeoutS = 40;

// The tiny run's arguments for 2 ranks in `dir`, with `options` after them.
std::string arguments(const TemporaryDirectory& dir, const std::string& options) {
  Config config = testing::tiny_run(dir.path());
  config.train.max_steps = 2;
  config.optim.warmup_steps = 1;
  config.train.eval_every = 1000000;
  config.train.threads = 1;
  config.data.micro_batch = 2;
  const auto path = dir / "run.yaml";
  testing::write_text(path, config_to_yaml(config));
  return fmt::format("{} --set train.run_dir={} --set dist.timeout_s={} {}", path.string(),
                     (dir / "run").string(), kTimeoutS, options);
}

struct Ranks {
  int rank0 = -1;
  int rank1 = -1;
  double seconds = 0;  // until both had ended
  std::string log0;
  std::string log1;
};

// Two ranks, each with its launcher's variables before the same arguments; each killed past
// twice the timeout.
Ranks two_ranks(const TemporaryDirectory& dir, const std::string& variables0,
                const std::string& variables1, const std::string& arguments) {
  const auto start = Clock::now();
  const auto run = run_command(
      fmt::format("{0} timeout {5} {2} {3} > {4}/rank0.txt 2>&1 & "
                  "{1} timeout {5} {2} {3} > {4}/rank1.txt 2>&1; one=$?; wait $!; zero=$?; "
                  "echo exits $zero $one",
                  variables0, variables1, kMltrain, arguments, dir.path().string(), 2 * kTimeoutS));
  Ranks ranks;
  ranks.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::sscanf(run.output.c_str(), "exits %d %d", &ranks.rank0, &ranks.rank1);
  ranks.log0 = read_text(dir / "rank0.txt");
  ranks.log1 = read_text(dir / "rank1.txt");
  return ranks;
}

// One rank, as two_ranks starts each.
testing::CommandResult one_rank(const std::string& variables, const std::string& arguments) {
  return run_command(
      fmt::format("{} timeout {} {} {}", variables, 2 * kTimeoutS, kMltrain, arguments));
}

std::string slurm_rank(int rank, int ranks = 2) {
  return fmt::format("SLURM_PROCID={0} SLURM_LOCALID={0} SLURM_NTASKS={1} SLURM_NODELIST=localhost",
                     rank, ranks);
}

std::string torchrun_rank(int rank, int ranks, int port) {
  return fmt::format("RANK={0} LOCAL_RANK={0} WORLD_SIZE={1} MASTER_ADDR=127.0.0.1 MASTER_PORT={2}",
                     rank, ranks, port);
}

// Both ranks ended with exit 2, well within the timeout, each saying `message`.
void expect_both_refused(const Ranks& ranks, const std::string& message) {
  EXPECT_EQ(ranks.rank0, kExitUserError) << ranks.log0;
  EXPECT_EQ(ranks.rank1, kExitUserError) << ranks.log1;
  EXPECT_LT(ranks.seconds, kTimeoutS - 10) << ranks.log0 << ranks.log1;
  EXPECT_CONTAINS(ranks.log0, message);
  EXPECT_CONTAINS(ranks.log1, message);
}

// A record of a c10d FileStore's file: the key's length and bytes, then the value's.
std::string store_record(const std::string& key, const std::string& value) {
  std::string record;
  for (const std::string* text : {&key, &value}) {
    const uint32_t length = static_cast<uint32_t>(text->size());
    record.append(reinterpret_cast<const char*>(&length), sizeof(length));
    record += *text;
  }
  return record;
}

// The run's own config file given as the store's file: c10d's FileStore read its text as records
// and waited, both ranks, for the bytes a length promised. Each rank now refuses it at once and
// leaves it as it was; so too for other files that are no store's.
TEST(Rendezvous, AFileThatIsNoStoreIsRefusedByEveryRankAtOnce) {
  TemporaryDirectory dir;
  const std::string config = (dir / "run.yaml").string();
  const std::string args = arguments(dir, "--set dist.rendezvous=file:" + config);
  const std::string before = read_text(config);
  const Ranks ranks = two_ranks(dir, slurm_rank(0), slurm_rank(1), args);
  expect_both_refused(ranks, fmt::format("dist.rendezvous file:{0}: {0} is there already and is "
                                         "not a c10d file store",
                                         config));
  EXPECT_EQ(read_text(config), before);

  const std::string promise = std::string("\x64\0\0\0", 4);  // a key of 100 bytes, and no more
  for (const std::string& text :
       {std::string("hello\n"), promise, store_record("/ok", "1") + promise,
        store_record("not a key of a store", "1"), store_record("/ok", "1").substr(0, 9)}) {
    const auto store = dir / "store";
    testing::write_text(store, text);
    const auto refused =
        one_rank(slurm_rank(0), arguments(dir, "--set dist.rendezvous=file:" + store.string()));
    EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
    EXPECT_CONTAINS(refused.output, "is there already and is not a c10d file store");
    EXPECT_EQ(read_text(store), text);
  }
}

// A file another program holds locked: the store's lock waited for it without end.
TEST(Rendezvous, AFileAnotherProgramHoldsLockedEndsWithinTheTimeout) {
  TemporaryDirectory dir;
  const auto store = dir / "store";
  testing::write_text(store, "");
  const int fd = ::open(store.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const auto start = Clock::now();
  const auto refused = one_rank(
      slurm_rank(1),
      arguments(dir, "--set dist.rendezvous=file:" + store.string() + " --set dist.timeout_s=2"));
  ::close(fd);
  EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 20.0);
  EXPECT_CONTAINS(refused.output, "another process held a lock on " + store.string() +
                                      " for all of dist.timeout_s = 2 s");
}

// A store an earlier run left, whose ranks all met there: once read as this run's meeting (the
// ranks counted it and went on without each other); now a line for every rank.
TEST(Rendezvous, AStoreAnEarlierRunLeftIsRefused) {
  TemporaryDirectory dir;
  const auto store = dir / "store";
  testing::write_text(
      store, store_record("refcount/", "2") + store_record("/mltrain/checked_in", "2") +
                 store_record("/mltrain/rank/0", "1") + store_record("/mltrain/world_size", "2 0") +
                 store_record("/mltrain/rank/1", "1") + store_record("/mltrain/arrived", "2"));
  const Ranks ranks = two_ranks(dir, slurm_rank(0), slurm_rank(1),
                                arguments(dir, "--set dist.rendezvous=file:" + store.string()));
  expect_both_refused(ranks,
                      "is the store of ranks that met there before this one (2 of 2 ranks): "
                      "it was left by an earlier run");
}

// Ranks given different numbers of ranks: the one of 2 met its peer and then waited in Gloo for a
// third ("wait timeout ... keys: /mltrain/gloo/0/1"), for all of dist.timeout_s. Now the ranks
// compare at the store, and both end at once naming the variable, under torchrun's variables and
// Slurm's alike.
TEST(Rendezvous, RanksStartedWithDifferentNumbersOfRanksAreRefusedAtOnce) {
  TemporaryDirectory dir;
  const int port = testing::free_port();
  const Ranks torchrun =
      two_ranks(dir, torchrun_rank(0, 2, port), torchrun_rank(1, 3, port), arguments(dir, ""));
  expect_both_refused(torchrun, "was started with WORLD_SIZE=");
  for (const std::string& log : {torchrun.log0, torchrun.log1}) {
    EXPECT_CONTAINS(log, "WORLD_SIZE=2");
    EXPECT_CONTAINS(log, "WORLD_SIZE=3");
    EXPECT_CONTAINS(log, "start every rank with the same number of ranks");
  }
  const Ranks slurm =
      two_ranks(dir, slurm_rank(0, 3), slurm_rank(1, 2),
                arguments(dir, "--set dist.rendezvous=file:" + (dir / "store").string()));
  expect_both_refused(slurm, "was started with SLURM_NTASKS=");
}

// Two processes given the same rank both counted at the store as ranks of the run, and met as
// two. (Two of rank 0 meet the run directory's lock first, which says so.)
TEST(Rendezvous, TwoRanksOfTheSameNumberAreRefused) {
  TemporaryDirectory dir;
  const Ranks ranks =
      two_ranks(dir, slurm_rank(1), slurm_rank(1),
                arguments(dir, "--set dist.rendezvous=file:" + (dir / "store").string()));
  expect_both_refused(ranks, "two ranks were started with SLURM_PROCID=1");
}

// A rank that never comes: the rendezvous says how many came and which did not, at the store
// named, over TCP and at a file.
TEST(Rendezvous, ARendezvousThatTimesOutSaysWhichRanksDidNotCome) {
  TemporaryDirectory dir;
  const int port = testing::free_port();
  const auto tcp = one_rank(torchrun_rank(0, 2, port), arguments(dir, "--set dist.timeout_s=2"));
  EXPECT_EQ(tcp.exit_code, kExitRuntimeFailure) << tcp.output;
  EXPECT_CONTAINS(tcp.output,
                  fmt::format("rank 0 of 2: the rendezvous at 127.0.0.1:{} (TCP, served by rank 0) "
                              "failed within dist.timeout_s = 2 s: 1 of 2 ranks arrived; rank 1 "
                              "did not come",
                              port));
  const auto store = dir / "store";
  const auto file = one_rank(
      slurm_rank(1, 3),
      arguments(dir, "--set dist.rendezvous=file:" + store.string() + " --set dist.timeout_s=2"));
  EXPECT_EQ(file.exit_code, kExitRuntimeFailure) << file.output;
  EXPECT_CONTAINS(file.output,
                  fmt::format("rank 1 of 3: the rendezvous at the file store {} failed within "
                              "dist.timeout_s = 2 s: 1 of 3 ranks arrived; ranks 0 and 2 did not "
                              "come",
                              store.string()));
}

// A blank MASTER_ADDR under Slurm's variables was looked up for 10 to 20 s; under torchrun's it
// was exit 2 at once. Now both are.
TEST(Rendezvous, ABlankMasterAddrIsExitTwoAtOnce) {
  TemporaryDirectory dir;
  for (const std::string& variables :
       {slurm_rank(0) + " MASTER_ADDR=", slurm_rank(0) + " MASTER_ADDR=' '",
        fmt::format("RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT={} MASTER_ADDR=' '",
                    testing::free_port())}) {
    const auto start = Clock::now();
    const auto refused = one_rank(variables, arguments(dir, ""));
    EXPECT_EQ(refused.exit_code, kExitUserError) << variables << "\n" << refused.output;
    EXPECT_CONTAINS(refused.output, "MASTER_ADDR");
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 8.0) << variables;
  }
}

}  // namespace
}  // namespace mltrain
