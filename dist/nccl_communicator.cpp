#include "dist/nccl_communicator.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "dist/flight_recorder.h"
#include "dist/watchdog.h"

namespace mltrain {
namespace {

using Clock = std::chrono::steady_clock;

// How long a rank whose NCCL collective failed may take to explain it (the flight records take
// at most 5 s) and abort before it ends anyway.
constexpr std::chrono::seconds kLastWords(20);

ncclDataType_t nccl_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kDouble:
      return ncclFloat64;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    default:
      throw std::invalid_argument(
          fmt::format("no NCCL type for {}", c10::toString(tensor.scalar_type())));
  }
}

// A non-blocking NCCL communicator: calls return at once, ncclInProgress meaning "still being
// set up or enqueued", so that every wait on it can have a deadline and abort can always run.
// NCCL allows one call at a time on a communicator: a mutex orders the training threads' calls,
// the watchdog's polls and abort.
class NcclComm {
 public:
  NcclComm(const World& world, double timeout_s, Communicator& host) : timeout_s_(timeout_s) {
    ncclUniqueId id;
    if (world.rank == 0) {
      const ncclResult_t made = ncclGetUniqueId(&id);
      if (made != ncclSuccess)
        throw std::runtime_error(
            fmt::format("ncclGetUniqueId failed: {}", ncclGetErrorString(made)));
    }
    host.broadcast(at::from_blob(&id, {static_cast<int64_t>(sizeof(id))}, at::kByte), 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const std::lock_guard lock(mutex_);
    ok_or_abort(ncclCommInitRankConfig(&comm_, world.size, id, world.rank, &config),
                "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig");
  }
  // A clean exit finalizes (flushing what is in flight) and destroys; unwinding from an error
  // aborts, since a peer may be gone and finalizing would wait for it.
  ~NcclComm() {
    const std::lock_guard lock(mutex_);
    if (aborted_) return;
    if (std::uncaught_exceptions() == 0 && finalize()) {
      ncclCommDestroy(comm_);
      return;
    }
    abort_locked();
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Makes `call(comm)`, an NCCL call on this communicator, and waits at most dist.timeout_s for
  // it to be enqueued (not finished on the device). A failure aborts the communicator and throws.
  template <class Call>
  void issue(const char* operation, Call call) {
    const std::lock_guard lock(mutex_);
    if (aborted_)
      throw std::runtime_error(fmt::format("{}: the NCCL communicator was aborted", operation));
    ok_or_abort(call(comm_), operation);
    settle(operation);
  }

  // The communicator's asynchronous error, empty if none: for the watchdog's thread. Empty too
  // once the host has aborted: the host reports its own error.
  std::string async_error() {
    const std::lock_guard lock(mutex_);
    if (aborted_) return "";
    const ncclResult_t state = async_state();
    return state == ncclSuccess || state == ncclInProgress ? "" : ncclGetErrorString(state);
  }

  // Ends every operation in flight on this communicator; from any thread, once.
  void abort() {
    const std::lock_guard lock(mutex_);
    abort_locked();
  }

 private:
  // The members below are called with mutex_ held.
  ncclResult_t async_state() {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    return state;
  }

  void ok_or_abort(ncclResult_t result, const char* operation) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    abort_locked();
    throw std::runtime_error(fmt::format("{} failed: {}", operation, ncclGetErrorString(result)));
  }

  // Waits, at most dist.timeout_s, until the last call is no longer in progress.
  void settle(const char* operation) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    for (ncclResult_t state = async_state(); state != ncclSuccess; state = async_state()) {
      ok_or_abort(state, operation);
      if (Clock::now() > deadline) {
        abort_locked();
        throw std::runtime_error(missed_deadline(operation, timeout_s_));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  bool finalize() {
    if (const ncclResult_t started = ncclCommFinalize(comm_);
        started != ncclSuccess && started != ncclInProgress) {
      return false;
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    ncclResult_t state = async_state();
    for (; state == ncclInProgress && Clock::now() < deadline; state = async_state())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (state == ncclInProgress)
      spdlog::warn("{}: aborting the communicator",
                   missed_deadline("ncclCommFinalize", timeout_s_));
    return state == ncclSuccess;
  }

  void abort_locked() {
    if (aborted_ || comm_ == nullptr) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  ncclComm_t comm_ = nullptr;
  double timeout_s_;
  std::mutex mutex_;
  bool aborted_ = false;
};

// Ordered after the work enqueued so far on `stream`: what the watchdog polls.
std::shared_ptr<at::cuda::CUDAEvent> record_on(const c10::cuda::CUDAStream& stream) {
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(stream);
  return event;
}

class NcclWork : public CollectiveWork {
 public:
  explicit NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done) : done_(std::move(done)) {}
  void wait() override { done_->block(c10::cuda::getCurrentCUDAStream(done_->device_index())); }
  bool completes_on_wait() const override { return false; }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const World& world, double timeout_s, std::unique_ptr<Communicator> host,
                   std::shared_ptr<FlightRecorder> flight)
      : Communicator(std::move(flight)),
        world_(world),
        timeout_s_(timeout_s),
        host_(std::move(host)),
        guard_(static_cast<c10::DeviceIndex>(world.local_rank)),
        comm_(world, timeout_s, *host_),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                             static_cast<c10::DeviceIndex>(world.local_rank))),
        watchdog_(
            std::chrono::duration<double>(timeout_s), [this] { return comm_.async_error(); },
            [this](const std::string& failure, int64_t seq) { end_run(failure, seq); }) {}

  // At a clean exit every operation in flight finishes (or the watchdog fires) before the
  // communicator is finalized.
  ~NcclCommunicator() override {
    if (std::uncaught_exceptions() == 0) watchdog_.drain();
  }

  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return host_->start_all_reduce_sum(value);
  }

  // A communicator of its own among the group's GPUs, set up through the host's group.
  std::unique_ptr<Communicator> group(const RankGroup& group) override {
    World members = world_;
    members.rank = group.rank;
    members.size = group.size;
    return std::make_unique<NcclCommunicator>(members, timeout_s_, host_->group(group),
                                              shared_flight());
  }

 protected:
  std::unique_ptr<CollectiveWork> start_all_reduce_average(const at::Tensor& tensor,
                                                           int64_t seq) override {
    return enqueue("all-reduce", "ncclAllReduce", seq, tensor, {tensor}, [&](ncclComm_t comm) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                           static_cast<size_t>(tensor.numel()), nccl_type(tensor), ncclAvg, comm,
                           stream_.stream());
    });
  }

  std::unique_ptr<CollectiveWork> start_reduce_scatter_average(const at::Tensor& input,
                                                               const at::Tensor& output,
                                                               int64_t seq) override {
    check_scatter_shapes(input, output, world_.size);
    return enqueue("reduce-scatter", "ncclReduceScatter", seq, input, {input, output},
                   [&](ncclComm_t comm) {
                     return ncclReduceScatter(input.data_ptr(), output.data_ptr(),
                                              static_cast<size_t>(output.numel()), nccl_type(input),
                                              ncclAvg, comm, stream_.stream());
                   });
  }

  std::unique_ptr<CollectiveWork> start_all_gather(const at::Tensor& tensor, int64_t seq) override {
    const int64_t part = part_numel(tensor, world_.size);
    // In place: this rank's part is where the gathered tensor holds it.
    const void* own = static_cast<const char*>(tensor.data_ptr()) +
                      world_.rank * part * static_cast<int64_t>(tensor.element_size());
    return enqueue("all-gather", "ncclAllGather", seq, tensor, {tensor}, [&](ncclComm_t comm) {
      return ncclAllGather(own, tensor.data_ptr(), static_cast<size_t>(part), nccl_type(tensor),
                           comm, stream_.stream());
    });
  }

  // On the compute stream, which the caller's work after it follows.
  std::unique_ptr<CollectiveWork> start_broadcast(const at::Tensor& tensor, int root,
                                                  int64_t seq) override {
    if (!tensor.is_cuda() || !tensor.is_contiguous())
      throw std::invalid_argument("NCCL broadcast needs a contiguous CUDA tensor");
    const auto stream = c10::cuda::getCurrentCUDAStream(tensor.device().index());
    comm_.issue("ncclBroadcast", [&](ncclComm_t comm) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(),
                           static_cast<size_t>(tensor.numel()), nccl_type(tensor), root, comm,
                           stream.stream());
    });
    auto done = record_on(stream);
    flight().started(seq);  // before the watchdog can see it complete
    watch(collective_name("broadcast", tensor), done, seq);
    return std::make_unique<NcclWork>(std::move(done));
  }

 private:
  // Enqueues `call` on the communication stream, after the work enqueued so far on the compute
  // stream (which makes `tensors`), and hands it to the watchdog as the `collective` of `named`.
  template <class Call>
  std::unique_ptr<CollectiveWork> enqueue(const char* collective, const char* nccl_call,
                                          int64_t seq, const at::Tensor& named,
                                          std::initializer_list<at::Tensor> tensors, Call call) {
    for (const at::Tensor& tensor : tensors) {
      if (!tensor.is_cuda() || !tensor.is_contiguous())
        throw std::invalid_argument(
            fmt::format("NCCL {} needs contiguous CUDA tensors", collective));
    }
    const auto compute = c10::cuda::getCurrentCUDAStream(named.device().index());
    record_on(compute)->block(stream_);  // the tensors are complete on the compute stream first
    comm_.issue(nccl_call, call);
    // The caching allocator must not reuse the buffers while the communication stream uses them.
    for (const at::Tensor& tensor : tensors) tensor.record_stream(stream_);
    auto done = record_on(stream_);
    flight().started(seq);  // enqueued on the stream, before the watchdog can see it complete
    watch(collective_name(collective, named), done, seq);
    return std::make_unique<NcclWork>(std::move(done));
  }

  // Hands `operation`, collective `seq`, done when `done` has happened on the device, to the
  // watchdog, whose thread queries the event with this rank's GPU current and records the
  // collective complete.
  void watch(std::string operation, std::shared_ptr<at::cuda::CUDAEvent> done, int64_t seq) {
    watchdog_.watch(
        std::move(operation),
        [this, done = std::move(done), seq] {
          const c10::cuda::CUDAGuard device(done->device_index());
          if (!done->query()) return false;
          flight().completed(seq);
          return true;
        },
        seq);
  }

  // The watchdog's verdict: collective `seq` is stuck or NCCL failed (-1: with none in flight, so
  // the last one issued is named). The host may itself be blocked on the device behind it, so the
  // process ends here. The message, with the ranks behind from the flight records, goes out
  // first; gathering those (on a shared filesystem) and abort (which ends this rank's kernels
  // waiting on its peers) can each block, so a timer started first ends the process should they
  // not return.
  void end_run(const std::string& failure, int64_t seq) {
    std::thread([] {
      std::this_thread::sleep_for(kLastWords);
      std::_Exit(kExitRuntimeFailure);
    }).detach();
    spdlog::error("{}", flight().explain_failure(seq < 0 ? flight().last_seq() : seq, failure));
    spdlog::default_logger()->flush();
    comm_.abort();
    std::_Exit(kExitRuntimeFailure);
  }

  World world_;  // this communicator's ranks: the run's, or a group's
  double timeout_s_;
  std::unique_ptr<Communicator> host_;  // the ranks' CPU communicator, for host values
  c10::cuda::CUDAGuard guard_;          // this rank's GPU is the current device while training
  NcclComm comm_;
  c10::cuda::CUDAStream stream_;
  Watchdog watchdog_;  // after comm_, so that it stops before comm_ finalizes
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, double timeout_s,
                                                     std::unique_ptr<Communicator> host,
                                                     std::shared_ptr<FlightRecorder> flight) {
  return std::make_unique<NcclCommunicator>(world, timeout_s, std::move(host), std::move(flight));
}

}  // namespace mltrain
