#include "dist/nccl_communicator.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace mltrain {
namespace {

using Clock = std::chrono::steady_clock;

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

// The non-blocking communicator shared by the communicator and its works.
class NcclComm {
 public:
  NcclComm(const World& world, double timeout_s) : timeout_(timeout_s) {
    ncclUniqueId id;
    if (world.rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, world.size, id, world.rank, &config),
          "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig");
  }
  ~NcclComm() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }

  void check(ncclResult_t result, const char* operation) const {
    if (result == ncclSuccess || result == ncclInProgress) return;
    throw std::runtime_error(fmt::format("{} failed: {}", operation, ncclGetErrorString(result)));
  }

  // Waits until the communicator has no call in progress (non-blocking mode), or fails.
  void settle(const char* operation) {
    wait_until([] { return true; }, operation);
  }

  // Polls `done` and the communicator's asynchronous error; aborts after the timeout.
  template <class Done>
  void wait_until(Done done, const char* operation) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        abort();
        throw std::runtime_error(fmt::format("{} failed: {} (did another rank die?)", operation,
                                             ncclGetErrorString(state)));
      }
      if (state == ncclSuccess && done()) return;
      if (Clock::now() > deadline) {
        abort();
        throw std::runtime_error(
            fmt::format("{} did not finish within dist.timeout_s = {} s: a rank died or hangs",
                        operation, timeout_));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  void abort() {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  double timeout_;
};

class NcclAllReduceWork : public CollectiveWork {
 public:
  NcclAllReduceWork(NcclComm& comm, at::Tensor tensor, c10::cuda::CUDAStream stream)
      : comm_(comm), tensor_(std::move(tensor)), stream_(stream) {}

  void launch() {
    const auto compute = c10::cuda::getCurrentCUDAStream(tensor_.device().index());
    ready_.record(compute);
    ready_.block(stream_);  // the gradients are complete on the compute stream first
    comm_.check(
        ncclAllReduce(tensor_.data_ptr(), tensor_.data_ptr(), static_cast<size_t>(tensor_.numel()),
                      nccl_type(tensor_), ncclAvg, comm_.get(), stream_.stream()),
        "ncclAllReduce");
    comm_.settle("ncclAllReduce");
    done_.record(stream_);
    // The caching allocator must not reuse the buffer while the communication stream uses it.
    tensor_.record_stream(stream_);
  }

  void wait() override {
    comm_.wait_until([this] { return done_.query(); }, "gradient all-reduce");
    done_.block(c10::cuda::getCurrentCUDAStream(tensor_.device().index()));
  }

 private:
  NcclComm& comm_;
  at::Tensor tensor_;
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAEvent ready_;
  at::cuda::CUDAEvent done_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const World& world, double timeout_s)
      : world_(world),
        guard_(static_cast<c10::DeviceIndex>(world.local_rank)),
        comm_(world, timeout_s),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                             static_cast<c10::DeviceIndex>(world.local_rank))) {}

  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

  std::unique_ptr<CollectiveWork> all_reduce_average(const at::Tensor& tensor) override {
    if (!tensor.is_cuda() || !tensor.is_contiguous())
      throw std::invalid_argument("NCCL all-reduce needs a contiguous CUDA tensor");
    auto work = std::make_unique<NcclAllReduceWork>(comm_, tensor, stream_);
    work->launch();
    return work;
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    const auto stream = c10::cuda::getCurrentCUDAStream(tensor.device().index());
    comm_.check(
        ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                      nccl_type(tensor), root, comm_.get(), stream.stream()),
        "ncclBroadcast");
    comm_.settle("ncclBroadcast");
    stream.synchronize();
  }

  double all_reduce_sum(double value) override {
    double sum = 0.0;
    if (MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
      throw std::runtime_error("MPI_Allreduce failed (did another rank die?)");
    }
    return sum;
  }

 private:
  World world_;
  c10::cuda::CUDAGuard guard_;
  NcclComm comm_;
  c10::cuda::CUDAStream stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, double timeout_s) {
  return std::make_unique<NcclCommunicator>(world, timeout_s);
}

}  // namespace mltrain
