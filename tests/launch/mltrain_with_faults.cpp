// mltrain_faults: the mltrain executable with failures made on purpose, for the tests that show
// what a crash, a full disk, a diverging run or a dead rank leave behind. Built from tests/ only:
// the shipped mltrain has no fault switch. The environment variable MLTRAIN_FAULT holds a
// comma-separated list of:
//   kill-during-checkpoint[:MOMENT]
//                            SIGKILL in a checkpoint save at MOMENT: weights (its weights file is
//                            written, the rest not; the default), files (every file is written,
//                            not yet renamed) or renamed (renamed, `latest` not yet updated)
//   fail-checkpoint-write    a checkpoint write fails as on a full disk
//   fail-share-write:R       rank R of a multi-rank run (Open MPI's rank) fails to write its share
//                            of a checkpoint as on a full disk, after writing it
//   checkpoint-write-waits-for-training
//                            once the weights of the run's first checkpoint are written, its
//                            write waits until the run has logged 2 steps more, and fails after a
//                            minute without them
//   nonfinite-gradients:A-B  the gradients of steps A..B (counted from 1) are NaN
//   spike-loss:A-B           the averaged loss of steps A..B is 10 times what it was (their
//                            gradients are left alone)
//   spike-loss-once:A-B      as spike-loss:A-B, the first time each of the steps trains only: after
//                            a rollback the same steps read other samples, and train normally
//   print-windows            each micro-batch prints "windows S R: I,J,..." on stderr: its step,
//                            its rank and the indices of the training windows it reads
//   kill-rank:R              rank R of a multi-rank run SIGKILLs itself in step 3
//   hang-rank:R              rank R of a multi-rank run says "rank R hangs" on stderr and sleeps
//                            in step 3 (its other threads run on) until its launcher is gone,
//                            then exits: a hung rank outlives no test
//   stop-rank:R              rank R of a multi-rank run says "rank R stops" on stderr and stops
//                            itself with SIGSTOP in step 3 (every thread of it stops); once
//                            continued, it hangs as hang-rank does
//   forbid-host-sync:A-B     from the gradients of each step A..B to the next step's, any call
//                            that makes the host wait for the GPU throws (CUDA's sync debug mode)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launch/mltrain_command.h"
#include "trainer/checkpoint/checkpoint_format.h"

namespace {

std::vector<std::string> faults() {
  const char* value = std::getenv("MLTRAIN_FAULT");
  std::vector<std::string> list;
  std::istringstream in(value == nullptr ? "" : value);
  for (std::string fault; std::getline(in, fault, ',');) list.push_back(fault);
  return list;
}

// The steps A..B of "nonfinite-gradients:A-B" (or :A alone).
std::pair<int64_t, int64_t> step_range(const std::string& range) {
  const size_t dash = range.find('-');
  const int64_t first = std::stoll(range.substr(0, dash));
  return {first, dash == std::string::npos ? first : std::stoll(range.substr(dash + 1))};
}

// The SaveMoment of kill-during-checkpoint's ":weights", ":files" or ":renamed" ("": weights).
mltrain::SaveMoment save_moment(const std::string& suffix) {
  if (suffix.empty() || suffix == ":weights") return mltrain::SaveMoment::weights_written;
  if (suffix == ":files") return mltrain::SaveMoment::files_written;
  if (suffix == ":renamed") return mltrain::SaveMoment::renamed;
  throw std::invalid_argument("unknown moment of kill-during-checkpoint" + suffix);
}

// The last step in a run directory's metrics.jsonl (its "step" keys; 0: none yet).
int64_t last_metrics_step(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  int64_t step = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t key = line.find("\"step\":");
    if (key != std::string::npos) step = std::max<int64_t>(step, std::stoll(line.substr(key + 7)));
  }
  return step;
}

// checkpoint-write-waits-for-training: shows that training goes on during a background write,
// which a write that stopped training would wait for in vain.
void wait_for_training(mltrain::SaveMoment moment, const std::filesystem::path& directory) {
  static bool waited = false;  // the saves of a run come one after another
  if (moment != mltrain::SaveMoment::weights_written || std::exchange(waited, true)) return;
  const std::filesystem::path run_dir = directory.parent_path().parent_path();
  const int64_t saved = *mltrain::checkpoint_step(directory.stem().string());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (last_metrics_step(run_dir) < saved + 2) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("training did not go on while the checkpoint was written");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

mltrain::TrainingHooks hooks_for(const std::vector<std::string>& faults) {
  mltrain::TrainingHooks hooks;
  std::vector<std::function<void(int64_t, int, const std::vector<at::Tensor>&)>> after_gradients;
  const std::string kill_during_checkpoint = "kill-during-checkpoint";
  const std::string nonfinite = "nonfinite-gradients:";
  const std::string spike = "spike-loss:";
  const std::string spike_once = "spike-loss-once:";
  const std::string forbid_sync = "forbid-host-sync:";
  const std::string kill_rank = "kill-rank:";
  const std::string hang_rank = "hang-rank:";
  const std::string stop_rank = "stop-rank:";
  for (const std::string& fault : faults) {
    if (fault.starts_with(kill_during_checkpoint)) {
      const mltrain::SaveMoment chosen = save_moment(fault.substr(kill_during_checkpoint.size()));
      hooks.during_checkpoint_write = [chosen](mltrain::SaveMoment moment,
                                               const std::filesystem::path&) {
        if (moment == chosen) std::raise(SIGKILL);
      };
    } else if (fault == "fail-checkpoint-write") {
      hooks.during_checkpoint_write = [](mltrain::SaveMoment moment,
                                         const std::filesystem::path& directory) {
        if (moment != mltrain::SaveMoment::weights_written) return;
        throw std::runtime_error(fmt::format("cannot write {}: No space left on device (injected)",
                                             (directory / "optimizer.safetensors").string()));
      };
    } else if (fault.starts_with("fail-share-write:")) {
      const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
      if (rank == nullptr || std::stoi(rank) != std::stoi(fault.substr(fault.find(':') + 1)))
        continue;
      hooks.during_checkpoint_write = [rank = std::string(rank)](
                                          mltrain::SaveMoment moment,
                                          const std::filesystem::path& directory) {
        if (moment != mltrain::SaveMoment::share_written) return;
        throw std::runtime_error(
            fmt::format("rank {} cannot write {}: No space left on device (injected)", rank,
                        (directory / "model.safetensors").string()));
      };
    } else if (fault == "checkpoint-write-waits-for-training") {
      hooks.during_checkpoint_write = wait_for_training;
    } else if (fault.starts_with(spike)) {
      const auto [first, last] = step_range(fault.substr(spike.size()));
      hooks.after_loss = [first, last](int64_t step, const at::Tensor& loss) {
        if (step >= first && step <= last) loss.mul_(10);
      };
    } else if (fault.starts_with(spike_once)) {
      const auto [first, last] = step_range(fault.substr(spike_once.size()));
      hooks.after_loss = [first, last, trained = std::set<int64_t>()](
                             int64_t step, const at::Tensor& loss) mutable {
        if (step >= first && step <= last && trained.insert(step).second) loss.mul_(10);
      };
    } else if (fault == "print-windows") {
      hooks.read_windows = [](int64_t step, int rank, const std::vector<int64_t>& windows) {
        fmt::print(stderr, "windows {} {}: {}\n", step, rank, fmt::join(windows, ","));
      };
    } else if (fault.starts_with(nonfinite)) {
      const auto [first, last] = step_range(fault.substr(nonfinite.size()));
      after_gradients.emplace_back(
          [first, last](int64_t step, int, const std::vector<at::Tensor>& gradients) {
            if (step >= first && step <= last) gradients.front().fill_(NAN);
          });
    } else if (fault.starts_with(forbid_sync)) {
      const auto [first, last] = step_range(fault.substr(forbid_sync.size()));
      after_gradients.emplace_back([first, last](int64_t step, int,
                                                 const std::vector<at::Tensor>&) {
        c10::cuda::warning_state().set_sync_debug_mode(step >= first && step <= last
                                                           ? c10::cuda::SyncDebugMode::L_ERROR
                                                           : c10::cuda::SyncDebugMode::L_DISABLED);
      });
    } else if (fault.starts_with(kill_rank) || fault.starts_with(hang_rank) ||
               fault.starts_with(stop_rank)) {
      const std::string kind = fault.substr(0, fault.find(':'));
      const int chosen = std::stoi(fault.substr(fault.find(':') + 1));
      after_gradients.emplace_back(
          [kind, chosen](int64_t step, int rank, const std::vector<at::Tensor>&) {
            if (rank != chosen || step != 3) return;
            if (kind == "kill-rank") std::raise(SIGKILL);
            fmt::print(stderr, "rank {} {}\n", rank, kind == "stop-rank" ? "stops" : "hangs");
            std::fflush(stderr);
            const pid_t launcher = ::getppid();
            if (kind == "stop-rank") std::raise(SIGSTOP);
            while (::getppid() == launcher)
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
            std::_Exit(1);
          });
    } else {
      throw std::invalid_argument("unknown MLTRAIN_FAULT " + fault);
    }
  }
  if (!after_gradients.empty()) {
    hooks.after_gradients = [after_gradients](int64_t step, int rank,
                                              const std::vector<at::Tensor>& gradients) {
      for (const auto& hook : after_gradients) hook(step, rank, gradients);
    };
  }
  return hooks;
}

}  // namespace

int main(int argc, char** argv) { return mltrain::run_mltrain(argc, argv, hooks_for(faults())); }
