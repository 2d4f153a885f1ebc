#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dist/world.h"

namespace mltrain {

class FlightRecorder;  // dist/flight_recorder.h

// A collective operation in flight.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  // Makes the result available to what the caller runs next. On the CPU this blocks until the
  // result is in place. On CUDA it only orders the caller's current stream after the operation:
  // the host goes on, and the communicator's watchdog bounds the operation by dist.timeout_s.
  virtual void wait() = 0;
  // Whether wait() returns only once the operation is complete (the CPU's), rather than ordering
  // the caller's stream after it (CUDA's, whose watchdog sees it complete).
  virtual bool completes_on_wait() const { return true; }
};

// Some of a communicator's ranks, as each of them names its own group: the ranks that give the
// same `color` form one, of `size` ranks, in which this rank is `rank` (from 0). `name` says in
// messages and in Gloo's store what the groups are for (every group made from one communicator
// needs a name of its own).
struct RankGroup {
  std::string name;
  int color = 0;
  int rank = 0;
  int size = 1;
};

// A sum of host values over the ranks, in flight.
class PendingSum {
 public:
  virtual ~PendingSum() = default;
  // Blocks until the sum is known (at most dist.timeout_s) and returns it.
  virtual double wait() = 0;
};

// Collectives among the ranks of a World. Every rank must call the same collectives in the same
// order. Implementations: MPI over CPU tensors (multi-rank training, and the tests), Gloo over CPU
// tensors (ranks started without MPI), NCCL over CUDA tensors, and a world of one where every
// collective is the identity.
//
// Every collective among ranks is recorded in the communicator's flight recorder
// (flight_recorder.h): the public functions number and record the tensor collectives and hand them
// to the backend's start_ functions; the backends record their host sums themselves
// (recorded_sum), as NCCL's are its CPU communicator's, and a world of one, which sums nothing,
// records none. A failure to start or to finish a collective is rethrown with the flight
// recorder's explanation: the ranks that had not reached it.
class Communicator {
 public:
  explicit Communicator(std::shared_ptr<FlightRecorder> flight);
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's place among every rank of the run: rank(), but for a group's communicator.
  virtual int run_rank() const { return rank(); }

  // Replaces a contiguous tensor with its average over the ranks; asynchronous. `bucket` names
  // the gradient bucket it carries in the flight record (-1: none).
  std::unique_ptr<CollectiveWork> all_reduce_average(const at::Tensor& tensor, int bucket = -1);
  // Averages the contiguous `input` over the ranks and leaves this rank's part of the average in
  // the contiguous `output`: rank r gets input's elements [r n, (r + 1) n), where n is
  // output.numel() and input.numel() is size() n. Asynchronous; neither tensor may change before
  // wait(). With replicas (hybrid sharding), the average is over this rank's group only, and
  // average_across_replicas completes it.
  std::unique_ptr<CollectiveWork> reduce_scatter_average(const at::Tensor& input,
                                                         const at::Tensor& output, int bucket = -1);
  // Replaces `part` (a reduce-scatter's output, or a sum of them) with its average over the ranks
  // that hold the same part in the other groups of a hybrid sharding (hybrid_communicator.h):
  // once a step, where the reduce-scatters of every micro-step stay within the group. Without
  // replicas, nothing. Asynchronous.
  virtual std::unique_ptr<CollectiveWork> average_across_replicas(const at::Tensor& part);
  // Fills the contiguous `tensor`, of size() parts of n elements, with every rank's own part: rank
  // r's elements [r n, (r + 1) n) reach every rank. In place; asynchronous.
  std::unique_ptr<CollectiveWork> all_gather(const at::Tensor& tensor, int bucket = -1);
  // Copies root's tensor into every rank's, ordered before what the caller runs next on the
  // tensor's device (as CollectiveWork::wait).
  void broadcast(const at::Tensor& tensor, int root);
  // Starts the sum over the ranks of a host value (stop flags, token counts, hashes), so that
  // the host can go on and collect the sum later.
  virtual std::unique_ptr<PendingSum> start_all_reduce_sum(double value) = 0;

  // The sum over the ranks of a host value, waited for.
  double all_reduce_sum(double value) { return start_all_reduce_sum(value)->wait(); }

  // The communicator among the ranks of this rank's `group` (the same backend), whose collectives
  // this one's flight recorder records. A collective: every rank calls it, each naming its own
  // group, and the groups' collectives must then be issued in the same order on every rank, as if
  // they were this communicator's (so that the flight records of the ranks still line up).
  virtual std::unique_ptr<Communicator> group(const RankGroup& group) = 0;

  // This rank's flight recorder: the run sets its step and where failures write the records.
  FlightRecorder& flight() const;
  // The same, for the communicators made from this one (its groups) to share.
  const std::shared_ptr<FlightRecorder>& shared_flight() const { return flight_; }

 protected:
  // A communicator made of others (hybrid_communicator.h), which record its collectives as they
  // run them: its own are not recorded again.
  struct MadeOfOthers {};
  Communicator(std::shared_ptr<FlightRecorder> flight, MadeOfOthers);

  // The backend's side of the public collectives above, recorded as collective `seq`. A backend
  // whose wait() does not complete the operation records its completion itself.
  virtual std::unique_ptr<CollectiveWork> start_all_reduce_average(const at::Tensor& tensor,
                                                                   int64_t seq) = 0;
  virtual std::unique_ptr<CollectiveWork> start_reduce_scatter_average(const at::Tensor& input,
                                                                       const at::Tensor& output,
                                                                       int64_t seq) = 0;
  virtual std::unique_ptr<CollectiveWork> start_all_gather(const at::Tensor& tensor,
                                                           int64_t seq) = 0;
  virtual std::unique_ptr<CollectiveWork> start_broadcast(const at::Tensor& tensor, int root,
                                                          int64_t seq) = 0;

  // A host sum that `start` begins, recorded as a collective: for the backends'
  // start_all_reduce_sum.
  std::unique_ptr<PendingSum> recorded_sum(
      const std::function<std::unique_ptr<PendingSum>()>& start);

 private:
  // Records a collective asked for now, unless made of others; its number (0: not recorded).
  int64_t enqueued(std::string_view op, const at::Tensor& tensor, int bucket);
  // Collective `seq` as `start`, a backend's start_ function, starts it: recorded as started and,
  // once waited for, completed or failed.
  std::unique_ptr<CollectiveWork> recorded(
      int64_t seq, const std::function<std::unique_ptr<CollectiveWork>()>& start);

  std::shared_ptr<FlightRecorder> flight_;
  bool records_ = true;
};

// Work that is already complete: a collective with nothing to do.
std::unique_ptr<CollectiveWork> completed_work();

// How messages name a collective over `tensor`: collective_name("all-reduce", tensor) is "the
// all-reduce of 1024 Float values".
std::string collective_name(const std::string& collective, const at::Tensor& tensor);

// The elements of one rank's part of `whole`, a tensor of `size` equal parts (std::invalid_argument
// if it cannot be cut so).
int64_t part_numel(const at::Tensor& whole, int size);

// Throws std::invalid_argument unless `output` can take one rank's part of a reduce-scatter of
// `input` among `size` ranks: the same dtype, and a size-th of its elements.
void check_scatter_shapes(const at::Tensor& input, const at::Tensor& output, int size);

// Whether every rank holds the same bytes in `tensors`, compared through a hash. A collective.
bool same_on_all_ranks(const std::vector<at::Tensor>& tensors, Communicator& communicator);

// Whether `tensors` hold the same bytes on every replica of hybrid sharding (`sharded`'s
// average_across_replicas: the ranks of other groups that hold the same part), each rank's own,
// which differ within a group. Every rank of `everyone` gets the same answer.
bool same_across_replicas(const std::vector<at::Tensor>& tensors, Communicator& sharded,
                          Communicator& everyone);

// The communicator for `world` whose tensors live on `device`, for dist.backend `backend` (auto,
// nccl or mpi): the identity for a world of one not started by an MPI launcher, else NCCL for CUDA
// tensors, and for CPU tensors MPI under an MPI launcher or Gloo under the others (set up at the
// dist.rendezvous `rendezvous`, rendezvous_store.h); collectives that do not finish within
// timeout_s end the run. A backend that cannot carry the device's tensors (nccl on the CPU, mpi on
// CUDA) or that the launcher cannot start (mpi without MPI) is a UserError, not a silent fallback.
std::unique_ptr<Communicator> make_communicator(const World& world, c10::Device device = c10::kCPU,
                                                const std::string& backend = "auto",
                                                double timeout_s = 600.0,
                                                const std::string& rendezvous = "tcp");

}  // namespace mltrain
