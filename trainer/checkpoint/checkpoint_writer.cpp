#include "trainer/checkpoint/checkpoint_writer.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>

namespace mltrain {
namespace {

// The signals a person or a launcher sends to stop a run go to the training thread, which acts
// on them at a step boundary, and never interrupt the writer's system calls.
void block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  for (const int signal : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
    sigaddset(&signals, signal);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

// Low enough that training's threads win the cores (bench/checkpoint_pause.sh: the step beside a
// write slowed 2.2x at nice 0, 1.2x here), high enough that a write ends between checkpoints.
constexpr int kWriterNice = 10;

}  // namespace

CheckpointWriter::CheckpointWriter(const CheckpointStore& store, int rank, bool in_background,
                                   std::chrono::seconds share_patience, SaveObserver observe)
    : store_(store),
      rank_(rank),
      in_background_(in_background),
      share_patience_(share_patience),
      observe_(std::move(observe)) {}

CheckpointWriter::~CheckpointWriter() {
  if (!in_flight_.valid()) return;
  // The run is over: rank 0 stops awaiting ranks that may have ended before writing.
  abandoned_ = true;
  try {
    in_flight_.get();
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
  }
}

void CheckpointWriter::save(const CheckpointContents& contents, std::optional<int64_t> keep) {
  if (rank_ >= contents.writers) return;  // rank 0 writes what this rank holds
  if (!in_background_) {
    store_.write_share(contents, observe_);
    return;
  }
  wait();
  in_flight_ = std::async(std::launch::async, [this, contents, keep] {
    block_stop_signals();
    // Training comes first: on a CPU the write's copies and checksums need the cores it uses.
    // Linux takes a thread id here, for that thread alone.
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kWriterNice);
    return write_in_background(contents, keep);
  });
}

std::optional<std::filesystem::path> CheckpointWriter::write_in_background(
    const CheckpointContents& contents, std::optional<int64_t> keep) const {
  const auto start = std::chrono::steady_clock::now();
  std::string failure;
  try {
    store_.write_share(contents, observe_);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  if (rank_ != 0) {
    store_.mark_share(contents, rank_, failure);
    return std::nullopt;
  }
  try {
    store_.await_shares(contents, {.patience = share_patience_, .abandoned = &abandoned_});
  } catch (const std::exception& error) {
    if (failure.empty()) failure = error.what();
  }
  if (!failure.empty()) store_.give_up(contents.progress.step, failure);
  const std::filesystem::path path = store_.finish(contents, observe_, keep);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  spdlog::info("checkpoint: {} (written in {:.1f} s while training went on)", path.string(),
               seconds.count());
  return path;
}

std::filesystem::path CheckpointWriter::finish(const CheckpointContents& contents,
                                               std::optional<int64_t> keep) const {
  std::filesystem::path path = store_.finish(contents, observe_, keep);
  spdlog::info("checkpoint: {}", path.string());
  return path;
}

void CheckpointWriter::check() {
  if (in_flight_.valid() &&
      in_flight_.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
    in_flight_.get();
}

std::optional<std::filesystem::path> CheckpointWriter::wait() {
  if (!in_flight_.valid()) return std::nullopt;
  return in_flight_.get();
}

}  // namespace mltrain
