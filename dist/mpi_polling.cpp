#include "dist/mpi_polling.h"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "dist/watchdog.h"

namespace mltrain {
namespace {

class MpiHostSum : public PendingSum {
 public:
  MpiHostSum(double value, MPI_Comm comm, double timeout_s)
      : buffers_(std::make_unique<Buffers>(Buffers{value, 0.0})), timeout_s_(timeout_s) {
    check_mpi(
        MPI_Iallreduce(&buffers_->value, &buffers_->sum, 1, MPI_DOUBLE, MPI_SUM, comm, &request_),
        "MPI_Iallreduce");
  }
  MpiHostSum(const MpiHostSum&) = delete;
  MpiHostSum& operator=(const MpiHostSum&) = delete;
  // A sum dropped before it completed belongs to a run unwinding from an error, on its way to
  // MPI_Abort. Waiting for it could take another dist.timeout_s (the rank that hangs will not
  // answer this one either), so it is not waited for; its buffers are left to MPI, which may
  // still write them, rather than freed under it.
  ~MpiHostSum() override {
    int done = 0;
    if (request_ != MPI_REQUEST_NULL &&
        (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done == 0))
      (void)buffers_.release();
  }

  double wait() override {
    if (request_ != MPI_REQUEST_NULL)
      wait_for(request_, timeout_s_, "the all-reduce of a host value");
    return buffers_->sum;
  }

 private:
  struct Buffers {
    double value;
    double sum;
  };
  std::unique_ptr<Buffers> buffers_;  // where MPI reads and writes
  double timeout_s_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace

void check_mpi(int code, const std::string& operation) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(
      fmt::format("{} failed: {} (did another rank die?)", operation, std::string(text, length)));
}

void wait_for(MPI_Request& request, double timeout_s, const std::string& operation) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int done = 0;
  while (true) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), operation);
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error(missed_deadline(operation, timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::unique_ptr<PendingSum> start_host_sum(double value, MPI_Comm comm, double timeout_s) {
  return std::make_unique<MpiHostSum>(value, comm, timeout_s);
}

}  // namespace mltrain
