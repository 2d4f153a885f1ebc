#include "dist/communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "common/error.h"
#include "dist/flight_recorder.h"
#include "dist/gloo_communicator.h"
#include "dist/mpi_polling.h"
#include "dist/nccl_communicator.h"
#include "dist/rendezvous_store.h"
#include "dist/summed_work.h"

namespace mltrain {
namespace {

MPI_Datatype mpi_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kByte:
      return MPI_UINT8_T;
    default:
      throw std::invalid_argument(
          fmt::format("no MPI type for {}", c10::toString(tensor.scalar_type())));
  }
}

class KnownSum : public PendingSum {
 public:
  explicit KnownSum(double sum) : sum_(sum) {}
  double wait() override { return sum_; }

 private:
  double sum_;
};

// A world of one: every collective is the identity.
class SingleRankCommunicator : public Communicator {
 public:
  using Communicator::Communicator;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return std::make_unique<KnownSum>(value);
  }
  std::unique_ptr<Communicator> group(const RankGroup& group) override {
    if (group.size != 1) throw std::invalid_argument("a world of one has no group of more ranks");
    return std::make_unique<SingleRankCommunicator>(shared_flight());
  }

 protected:
  std::unique_ptr<CollectiveWork> start_all_reduce_average(const at::Tensor&, int64_t) override {
    return completed_work();
  }
  std::unique_ptr<CollectiveWork> start_reduce_scatter_average(const at::Tensor& input,
                                                               const at::Tensor& output,
                                                               int64_t) override {
    if (!input.is_same(output)) output.copy_(input.view_as(output));
    return completed_work();
  }
  std::unique_ptr<CollectiveWork> start_all_gather(const at::Tensor&, int64_t) override {
    return completed_work();
  }
  std::unique_ptr<CollectiveWork> start_broadcast(const at::Tensor&, int, int64_t) override {
    return completed_work();
  }
};

// A collective as its backend started it, recorded complete or failed in the flight recorder
// when waited for.
class RecordedWork : public CollectiveWork {
 public:
  RecordedWork(std::unique_ptr<CollectiveWork> work, std::shared_ptr<FlightRecorder> flight,
               int64_t seq)
      : work_(std::move(work)), flight_(std::move(flight)), seq_(seq) {}
  void wait() override {
    if (completes_on_wait()) {
      flight_->wait_for(seq_, [this] { work_->wait(); });
    } else {
      work_->wait();
    }
  }
  bool completes_on_wait() const override { return work_->completes_on_wait(); }

 private:
  std::unique_ptr<CollectiveWork> work_;
  std::shared_ptr<FlightRecorder> flight_;
  int64_t seq_;
};

class RecordedSum : public PendingSum {
 public:
  RecordedSum(std::unique_ptr<PendingSum> sum, std::shared_ptr<FlightRecorder> flight, int64_t seq)
      : sum_(std::move(sum)), flight_(std::move(flight)), seq_(seq) {}
  double wait() override {
    double sum = 0.0;
    flight_->wait_for(seq_, [&] { sum = sum_->wait(); });
    return sum;
  }

 private:
  std::unique_ptr<PendingSum> sum_;
  std::shared_ptr<FlightRecorder> flight_;
  int64_t seq_;
};

// MPI has no bf16 type: bf16 buffers travel as pairs of bytes, summed in float by this operation.
void sum_bf16(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const c10::BFloat16*>(in);
  auto* b = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *length; ++i)
    b[i] = c10::BFloat16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

void check_mpi_tensor(const at::Tensor& tensor, const char* collective) {
  if (!tensor.is_cpu() || !tensor.is_contiguous())
    throw std::invalid_argument(fmt::format("MPI {} needs a contiguous CPU tensor", collective));
  if (tensor.numel() > std::numeric_limits<int>::max())
    throw std::invalid_argument(fmt::format("MPI {} of over 2^31 elements", collective));
}

// MPI collectives on CPU tensors: multi-rank training on machines without GPUs. Over
// MPI_COMM_WORLD, or over a group's communicator, which it then owns.
class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, double timeout_s, std::shared_ptr<FlightRecorder> flight)
      : Communicator(std::move(flight)), comm_(comm), timeout_s_(timeout_s) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_);
    MPI_Type_commit(&bf16_type_);
    MPI_Op_create(&sum_bf16, /*commute=*/1, &bf16_sum_);
  }
  ~MpiCommunicator() override {
    MPI_Op_free(&bf16_sum_);
    MPI_Type_free(&bf16_type_);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return recorded_sum([&] { return start_host_sum(value, comm_, timeout_s_); });
  }

  std::unique_ptr<Communicator> group(const RankGroup& group) override {
    // MPI_Comm_split blocks with no deadline: every rank meets in a recorded host sum first, which
    // has one, so that a rank that never comes is named rather than waited for.
    all_reduce_sum(0.0);
    MPI_Comm comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, group.color, group.rank, &comm),
              fmt::format("MPI_Comm_split ({} group {})", group.name, group.color));
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    auto made = std::make_unique<MpiCommunicator>(comm, timeout_s_, shared_flight());
    if (made->rank() != group.rank || made->size() != group.size) {
      throw std::logic_error(fmt::format(
          "{} group {}: MPI made it rank {} of {}, where this rank named itself rank {} of {}",
          group.name, group.color, made->rank(), made->size(), group.rank, group.size));
    }
    return made;
  }

 protected:
  std::unique_ptr<CollectiveWork> start_all_reduce_average(const at::Tensor& tensor,
                                                           int64_t) override {
    check_mpi_tensor(tensor, "all-reduce");
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()),
                             type_of(tensor), sum_of(tensor), comm_, &request),
              "MPI_Iallreduce");
    return started(request, collective_name("all-reduce", tensor), tensor, {});
  }

  std::unique_ptr<CollectiveWork> start_reduce_scatter_average(const at::Tensor& input,
                                                               const at::Tensor& output,
                                                               int64_t) override {
    check_mpi_tensor(input, "reduce-scatter");
    check_mpi_tensor(output, "reduce-scatter");
    check_scatter_shapes(input, output, size_);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(),
                                        static_cast<int>(output.numel()), type_of(input),
                                        sum_of(input), comm_, &request),
              "MPI_Ireduce_scatter_block");
    return started(request, collective_name("reduce-scatter", input), output, {input});
  }

  std::unique_ptr<CollectiveWork> start_all_gather(const at::Tensor& tensor, int64_t) override {
    check_mpi_tensor(tensor, "all-gather");
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, tensor.data_ptr(),
                             static_cast<int>(part_numel(tensor, size_)), type_of(tensor), comm_,
                             &request),
              "MPI_Iallgather");
    return started(request, collective_name("all-gather", tensor), at::Tensor(), {tensor});
  }

  std::unique_ptr<CollectiveWork> start_broadcast(const at::Tensor& tensor, int root,
                                                  int64_t) override {
    check_mpi_tensor(tensor, "broadcast");
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(tensor.data_ptr(), static_cast<int>(tensor.numel()), type_of(tensor), root,
                         comm_, &request),
              "MPI_Ibcast");
    return started(request, collective_name("broadcast", tensor), at::Tensor(), {tensor});
  }

 private:
  // MPI's non-blocking collective `request`, named `name`: its wait polls until dist.timeout_s.
  std::unique_ptr<CollectiveWork> started(MPI_Request request, std::string name, at::Tensor average,
                                          std::vector<at::Tensor> in_flight) const {
    return std::make_unique<SummedWork>(
        [request, name = std::move(name), timeout_s = timeout_s_]() mutable {
          wait_for(request, timeout_s, name);
        },
        std::move(average), size_, std::move(in_flight));
  }

  MPI_Datatype type_of(const at::Tensor& tensor) const {
    return tensor.scalar_type() == at::kBFloat16 ? bf16_type_ : mpi_type(tensor);
  }
  MPI_Op sum_of(const at::Tensor& tensor) const {
    return tensor.scalar_type() == at::kBFloat16 ? bf16_sum_ : MPI_SUM;
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace

Communicator::Communicator(std::shared_ptr<FlightRecorder> flight) : flight_(std::move(flight)) {}

Communicator::Communicator(std::shared_ptr<FlightRecorder> flight, MadeOfOthers)
    : flight_(std::move(flight)), records_(false) {}

Communicator::~Communicator() = default;

FlightRecorder& Communicator::flight() const { return *flight_; }

std::unique_ptr<CollectiveWork> Communicator::average_across_replicas(const at::Tensor&) {
  return completed_work();
}

std::unique_ptr<CollectiveWork> Communicator::all_reduce_average(const at::Tensor& tensor,
                                                                 int bucket) {
  const int64_t seq = enqueued("all-reduce", tensor, bucket);
  return recorded(seq, [&] { return start_all_reduce_average(tensor, seq); });
}

std::unique_ptr<CollectiveWork> Communicator::reduce_scatter_average(const at::Tensor& input,
                                                                     const at::Tensor& output,
                                                                     int bucket) {
  const int64_t seq = enqueued("reduce-scatter", input, bucket);
  return recorded(seq, [&] { return start_reduce_scatter_average(input, output, seq); });
}

std::unique_ptr<CollectiveWork> Communicator::all_gather(const at::Tensor& tensor, int bucket) {
  const int64_t seq = enqueued("all-gather", tensor, bucket);
  return recorded(seq, [&] { return start_all_gather(tensor, seq); });
}

void Communicator::broadcast(const at::Tensor& tensor, int root) {
  const int64_t seq = enqueued("broadcast", tensor, -1);
  recorded(seq, [&] { return start_broadcast(tensor, root, seq); })->wait();
}

int64_t Communicator::enqueued(std::string_view op, const at::Tensor& tensor, int bucket) {
  return records_ ? flight_->enqueued(op, tensor.numel(), tensor.scalar_type(), bucket) : 0;
}

std::unique_ptr<PendingSum> Communicator::recorded_sum(
    const std::function<std::unique_ptr<PendingSum>()>& start) {
  const int64_t seq = flight_->enqueued("sum", 1, at::kDouble);
  std::unique_ptr<PendingSum> sum;
  flight_->explained(seq, [&] { sum = start(); });
  flight_->started(seq);
  return std::make_unique<RecordedSum>(std::move(sum), flight_, seq);
}

std::unique_ptr<CollectiveWork> Communicator::recorded(
    int64_t seq, const std::function<std::unique_ptr<CollectiveWork>()>& start) {
  if (!records_) return start();
  std::unique_ptr<CollectiveWork> work;
  flight_->explained(seq, [&] { work = start(); });
  flight_->started(seq);
  return std::make_unique<RecordedWork>(std::move(work), flight_, seq);
}

std::unique_ptr<CollectiveWork> completed_work() {
  class Completed : public CollectiveWork {
   public:
    void wait() override {}
  };
  return std::make_unique<Completed>();
}

std::string collective_name(const std::string& collective, const at::Tensor& tensor) {
  return fmt::format("the {} of {} {} values", collective, tensor.numel(),
                     c10::toString(tensor.scalar_type()));
}

void check_scatter_shapes(const at::Tensor& input, const at::Tensor& output, int size) {
  if (input.scalar_type() != output.scalar_type() || part_numel(input, size) != output.numel())
    throw std::invalid_argument("reduce-scatter: the output is not one rank's part of the input");
}

int64_t part_numel(const at::Tensor& whole, int size) {
  if (whole.numel() % size != 0) {
    throw std::invalid_argument(
        fmt::format("{} elements do not split into {} equal parts", whole.numel(), size));
  }
  return whole.numel() / size;
}

namespace {

// 32 bits of the hash of the tensors' bytes: exact in a double, and in a sum of many.
double hash_of(const std::vector<at::Tensor>& tensors) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const at::Tensor& tensor : tensors) {
    const at::Tensor bytes = tensor.detach().to(at::kCPU).contiguous();
    XXH3_64bits_update(state, bytes.data_ptr(), bytes.nbytes());
  }
  const double hash = static_cast<double>(XXH3_64bits_digest(state) & 0xFFFFFFFFu);
  XXH3_freeState(state);
  return hash;
}

}  // namespace

bool same_across_replicas(const std::vector<at::Tensor>& tensors, Communicator& sharded,
                          Communicator& everyone) {
  const double hash = hash_of(tensors);
  const c10::Device device = tensors.empty() ? c10::Device(c10::kCPU) : tensors.front().device();
  // The replicas' average of integers below 2^32: this rank's hash where all agree, up to the
  // rounding of an average that multiplies by 1/n before it sums (NCCL's); where they differ, the
  // average is at least 1/2 from some rank's hash.
  const at::Tensor probe = at::full({1}, hash, at::TensorOptions(at::kDouble).device(device));
  sharded.average_across_replicas(probe)->wait();
  const bool differs = std::abs(probe.item<double>() - hash) > 0.25;
  return everyone.all_reduce_sum(differs ? 1.0 : 0.0) == 0.0;
}

bool same_on_all_ranks(const std::vector<at::Tensor>& tensors, Communicator& communicator) {
  const double hash = hash_of(tensors);
  const double leader_hash = communicator.all_reduce_sum(communicator.rank() == 0 ? hash : 0.0);
  return communicator.all_reduce_sum(hash == leader_hash ? 0.0 : 1.0) == 0.0;
}

std::unique_ptr<Communicator> make_communicator(const World& world, c10::Device device,
                                                const std::string& backend, double timeout_s,
                                                const std::string& rendezvous) {
  if (world.size > 1 && backend == "nccl" && !device.is_cuda()) {
    throw UserError("dist.backend nccl needs CUDA training (train.device); use auto on the CPU");
  }
  if (world.size > 1 && backend == "mpi" && device.is_cuda()) {
    throw UserError("dist.backend mpi all-reduces CPU tensors; CUDA training uses nccl (or auto)");
  }
  if (world.size > 1 && backend == "mpi" && !world.uses_mpi) {
    throw UserError(fmt::format(
        "dist.backend mpi needs an MPI launcher (mpirun, srun --mpi), and this run was started by "
        "{}: CPU ranks started so use Gloo (dist.backend auto)",
        launcher_name(world.launcher)));
  }
  // A failing rank waits this long for the other ranks' flight records: they write theirs within
  // a fraction of a second of its request, unless they are stopped or gone.
  auto flight = std::make_shared<FlightRecorder>(
      world.rank, world.size, std::chrono::duration<double>(std::min(5.0, timeout_s)));
  // Under an MPI launcher even one rank talks through the real backend: `mpirun -n 1` is how the
  // NCCL path is smoke-tested on a single GPU.
  if (!world.uses_mpi && world.size == 1)
    return std::make_unique<SingleRankCommunicator>(std::move(flight));
  // The ranks' CPU communicator: the CPU run's, and the host values' of a CUDA run.
  std::unique_ptr<Communicator> host =
      world.uses_mpi
          ? std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout_s, flight)
          : make_gloo_communicator(world, connect_rendezvous(world, rendezvous, timeout_s),
                                   timeout_s, flight);
  if (device.is_cuda())
    return make_nccl_communicator(world, timeout_s, std::move(host), std::move(flight));
  return host;
}

}  // namespace mltrain
