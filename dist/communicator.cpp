#include "dist/communicator.h"

#include "dist/nccl_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <mpi.h>
#include <xxhash.h>

#include <limits>

#include <stdexcept>

namespace mltrain {
namespace {

void check_mpi(int code, const char* operation) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(fmt::format("{} failed: {} (did another rank die?)", operation, std::string(text, length)));
}

MPI_Datatype mpi_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    default: throw std::invalid_argument(fmt::format("no MPI type for {}", c10::toString(tensor.scalar_type())));
  }
}

class DoneWork : public CollectiveWork {
 public:
  void wait() override {}
};

// A world of one: every collective is the identity.
class SingleRankCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<CollectiveWork> all_reduce_average(const at::Tensor&) override { return std::make_unique<DoneWork>(); }
  void broadcast(const at::Tensor&, int) override {}
  double all_reduce_sum(double value) override { return value; }
};

class MpiAllReduceWork : public CollectiveWork {
 public:
  MpiAllReduceWork(at::Tensor tensor, int world_size) : tensor_(std::move(tensor)), world_size_(world_size) {
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, tensor_.data_ptr(), static_cast<int>(tensor_.numel()), mpi_type(tensor_),
                             MPI_SUM, MPI_COMM_WORLD, &request_),
              "MPI_Iallreduce");
  }
  void wait() override {
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    tensor_.div_(world_size_);
  }

 private:
  at::Tensor tensor_;
  int world_size_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// MPI collectives on CPU tensors: multi-rank training on machines without GPUs.
class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(const World& world) : world_(world) {}
  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

  std::unique_ptr<CollectiveWork> all_reduce_average(const at::Tensor& tensor) override {
    if (!tensor.is_cpu() || !tensor.is_contiguous()) throw std::invalid_argument("MPI all-reduce needs a contiguous CPU tensor");
    if (tensor.numel() > std::numeric_limits<int>::max()) throw std::invalid_argument("MPI all-reduce of over 2^31 elements");
    return std::make_unique<MpiAllReduceWork>(tensor, world_.size);
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    check_mpi(MPI_Bcast(tensor.data_ptr(), static_cast<int>(tensor.numel()), mpi_type(tensor), root, MPI_COMM_WORLD),
              "MPI_Bcast");
  }

  double all_reduce_sum(double value) override {
    double sum = 0.0;
    check_mpi(MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    return sum;
  }

 private:
  World world_;
};

}  // namespace

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

std::unique_ptr<Communicator> make_communicator(const World& world, bool cuda, double timeout_s) {
  // Under an MPI launcher even one rank talks through the real backend: `mpirun -n 1` is how the
  // NCCL path is smoke-tested on a single GPU.
  if (!world.uses_mpi) return std::make_unique<SingleRankCommunicator>();
  if (cuda) return make_nccl_communicator(world, timeout_s);
  return std::make_unique<MpiCommunicator>(world);
}

}  // namespace mltrain
