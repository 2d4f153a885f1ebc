#include "dist/communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <xxhash.h>

#include <limits>
#include <stdexcept>

#include "common/error.h"
#include "dist/mpi_polling.h"
#include "dist/nccl_communicator.h"

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

class DoneWork : public CollectiveWork {
 public:
  void wait() override {}
};

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
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<CollectiveWork> all_reduce_average(const at::Tensor&) override {
    return std::make_unique<DoneWork>();
  }
  void broadcast(const at::Tensor&, int) override {}
  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return std::make_unique<KnownSum>(value);
  }
};

// MPI has no bf16 type: bf16 buffers travel as pairs of bytes, summed in float by this operation.
void sum_bf16(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const c10::BFloat16*>(in);
  auto* b = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *length; ++i)
    b[i] = c10::BFloat16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

class MpiAllReduceWork : public CollectiveWork {
 public:
  MpiAllReduceWork(at::Tensor tensor, int world_size, double timeout_s, MPI_Datatype type,
                   MPI_Op op)
      : tensor_(std::move(tensor)), world_size_(world_size), timeout_s_(timeout_s) {
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, tensor_.data_ptr(), static_cast<int>(tensor_.numel()),
                             type, op, MPI_COMM_WORLD, &request_),
              "MPI_Iallreduce");
  }
  void wait() override {
    wait_for(request_, timeout_s_, all_reduce_name(tensor_));
    tensor_.div_(world_size_);
  }

 private:
  at::Tensor tensor_;
  int world_size_;
  double timeout_s_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// MPI collectives on CPU tensors: multi-rank training on machines without GPUs.
class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(const World& world, double timeout_s) : world_(world), timeout_s_(timeout_s) {
    MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_);
    MPI_Type_commit(&bf16_type_);
    MPI_Op_create(&sum_bf16, /*commute=*/1, &bf16_sum_);
  }
  ~MpiCommunicator() override {
    MPI_Op_free(&bf16_sum_);
    MPI_Type_free(&bf16_type_);
  }
  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

  std::unique_ptr<CollectiveWork> all_reduce_average(const at::Tensor& tensor) override {
    if (!tensor.is_cpu() || !tensor.is_contiguous())
      throw std::invalid_argument("MPI all-reduce needs a contiguous CPU tensor");
    if (tensor.numel() > std::numeric_limits<int>::max())
      throw std::invalid_argument("MPI all-reduce of over 2^31 elements");
    const bool bf16 = tensor.scalar_type() == at::kBFloat16;
    return std::make_unique<MpiAllReduceWork>(tensor, world_.size, timeout_s_,
                                              bf16 ? bf16_type_ : mpi_type(tensor),
                                              bf16 ? bf16_sum_ : MPI_SUM);
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(tensor.data_ptr(), static_cast<int>(tensor.numel()), mpi_type(tensor),
                         root, MPI_COMM_WORLD, &request),
              "MPI_Ibcast");
    wait_for(request, timeout_s_, "a broadcast");
  }

  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return start_host_sum(value, timeout_s_);
  }

 private:
  World world_;
  double timeout_s_;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace

std::string all_reduce_name(const at::Tensor& tensor) {
  return fmt::format("the all-reduce of {} {} values", tensor.numel(),
                     c10::toString(tensor.scalar_type()));
}

bool same_on_all_ranks(const std::vector<at::Tensor>& tensors, Communicator& communicator) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const at::Tensor& tensor : tensors) {
    const at::Tensor bytes = tensor.detach().to(at::kCPU).contiguous();
    XXH3_64bits_update(state, bytes.data_ptr(), bytes.nbytes());
  }
  // 32 bits of the hash: exact in the double that all_reduce_sum carries.
  const double hash = static_cast<double>(XXH3_64bits_digest(state) & 0xFFFFFFFFu);
  XXH3_freeState(state);
  const double leader_hash = communicator.all_reduce_sum(communicator.rank() == 0 ? hash : 0.0);
  return communicator.all_reduce_sum(hash == leader_hash ? 0.0 : 1.0) == 0.0;
}

std::unique_ptr<Communicator> make_communicator(const World& world, c10::Device device,
                                                const std::string& backend, double timeout_s) {
  if (world.size > 1 && backend == "nccl" && !device.is_cuda()) {
    throw UserError(
        "dist.backend nccl needs CUDA training (train.device); use mpi or auto on the CPU");
  }
  if (world.size > 1 && backend == "mpi" && device.is_cuda()) {
    throw UserError("dist.backend mpi all-reduces CPU tensors; CUDA training uses nccl (or auto)");
  }
  // Under an MPI launcher even one rank talks through the real backend: `mpirun -n 1` is how the
  // NCCL path is smoke-tested on a single GPU.
  if (!world.uses_mpi) return std::make_unique<SingleRankCommunicator>();
  if (device.is_cuda()) return make_nccl_communicator(world, timeout_s);
  return std::make_unique<MpiCommunicator>(world, timeout_s);
}

}  // namespace mltrain
