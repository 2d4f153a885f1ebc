#include "trainer/checkpoint/checkpoint_writer.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>

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

CheckpointWriter::CheckpointWriter(const CheckpointStore& store, bool in_background,
                                   SaveObserver observe)
    : store_(store), in_background_(in_background), observe_(std::move(observe)) {}

CheckpointWriter::~CheckpointWriter() {
  if (!in_flight_.valid()) return;
  try {
    in_flight_.get();
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
  }
}

std::filesystem::path CheckpointWriter::write(const CheckpointContents& contents,
                                              std::optional<int64_t> keep) const {
  const auto start = std::chrono::steady_clock::now();
  std::filesystem::path path = store_.save(contents, observe_, keep);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  if (in_background_) {
    spdlog::info("checkpoint: {} (written in {:.1f} s while training went on)", path.string(),
                 seconds.count());
  } else {
    spdlog::info("checkpoint: {}", path.string());
  }
  return path;
}

std::optional<std::filesystem::path> CheckpointWriter::save(CheckpointContents contents,
                                                            std::optional<int64_t> keep) {
  if (!in_background_) return write(contents, keep);
  wait();
  in_flight_ = std::async(std::launch::async, [this, contents = std::move(contents), keep] {
    block_stop_signals();
    // Training comes first: on a CPU the write's copies and checksums need the cores it uses.
    // Linux takes a thread id here, for that thread alone.
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kWriterNice);
    return write(contents, keep);
  });
  return std::nullopt;
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
