#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"

namespace mltrain {

// Averages gradients over the ranks while backward runs, as PyTorch's DDP reducer does. It owns
// the gradients and never the parameters. The gradients lie in flat buckets (bucket_layout.h): each
// parameter's .grad is a view into its bucket, so backward accumulates straight into the buffer
// that is reduced, with no copies. A hook after each parameter's gradient accumulation counts its
// bucket down; a complete bucket is launched at once (overlap), strictly in bucket order on every
// rank, while backward goes on.
//
// Anything that replaces a .grad instead of accumulating into it (Module::zero_grad(), which
// leaves it undefined; a sparse gradient; backward with create_graph, which accumulates out of
// place) would have the bucket averaged while the optimizer reads the local gradient, and the
// ranks would drift apart. As in DDP's reducer, the same hook and finish() check that each .grad
// is still its bucket view and, where not, copy the gradient into the bucket and restore the view.
//
// All-reduced, every .grad ends as the average over the ranks. Scattered (ZeRO-1), each bucket is
// reduce-scattered instead, and each rank receives the average of its own part of each bucket
// only (averaged_parts()); each .grad keeps its own, unaveraged, gradient.
//
// Released (ZeRO-2, scattered), a bucket exists only from the first gradient that backward gives
// it until it is reduce-scattered: each gradient is copied into its bucket as it arrives and the
// .grad let go, a complete bucket is reduce-scattered at once (waited for at once without
// overlap; with it, while the next fills), and its part added to this rank's averaged parts. So
// every micro-step is reduce-scattered, not only the last (set_sync does not hold it back): the
// alternative, whole gradients kept until the last micro-step, would hold the whole model's
// gradients through every backward, which is what stage 2 exists to avoid; the cost is one
// reduce-scatter per micro-step instead of per step. A rank holds whole gradients of about two
// buckets at a time.
//
// Under hybrid sharding (hybrid_communicator.h) the reduce-scatters average within the rank's
// group, and finish() averages each part across the groups: once a step, not once a micro-step.
struct ReducerOptions {
  bool overlap = true;           // launch each bucket as soon as its gradients are complete
  bool compress_bf16 = false;    // buckets travel as bf16 (half the bytes), averaged in bf16
  bool scatter = false;          // reduce-scatter: each rank receives its part of each bucket
  bool release_buckets = false;  // with scatter: whole gradients only until reduce-scattered
  // Called with a bucket's index once backward has given every gradient of it (ZeRO-3 frees the
  // unit's weights then: nothing in backward reads them after its gradients are in), with the
  // reducer's mutex held and before the bucket is launched: it must not call into the reducer.
  std::function<void(size_t bucket)> on_bucket_complete = nullptr;
};

class GradReducer {
 public:
  // `buckets` lays out `parameters` (assign_buckets), with one part per rank when scattered.
  GradReducer(std::vector<at::Tensor> parameters, std::vector<BucketLayout> buckets,
              Communicator& communicator, ReducerOptions options);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Whether the coming backward communicates: off for the micro-steps of gradient accumulation
  // before the last one (their gradients only accumulate locally). Released, every micro-step
  // communicates, and this completes the micro-step before, should backward not have reached
  // every parameter.
  void set_sync(bool sync);

  // After the last micro-step's backward: waits for every bucket, launching those not yet launched
  // (all of them without overlap) one at a time, and readies the counters for the next step.
  void finish();

  // Zeroes the gradients in place (they must stay views into the buckets); released, this rank's
  // averaged parts, which add up the micro-steps.
  void zero_grad();

  // Scattered: this rank's part of each bucket's averaged gradient (released: summed over the
  // step's micro-steps), in the order of the buckets, once finish() has returned; empty when
  // all-reducing.
  const std::vector<at::Tensor>& averaged_parts() const { return averaged_parts_; }

  // How many gradients were found replaced and copied back into their buckets.
  int64_t gradients_copied_in() const { return copied_in_; }

 private:
  struct Bucket {
    BucketLayout layout;
    // The gradients' dtype and device: the parameters' when the reducer is made (ZeRO-3's may
    // be viewed in another dtype later, dist/unit_shards.h; their gradients are added in this one).
    at::TensorOptions options;
    at::Tensor buffer;     // flat gradients of its parameters (released: while it is in use)
    size_t pending = 0;    // gradients still to arrive in this backward
    at::Tensor wire;       // bf16 twin reduced in place of buffer, when compressing
    at::Tensor wire_part;  // bf16 twin of this rank's part, when compressing and scattering
    std::unique_ptr<CollectiveWork> work;
  };

  void check_layout(const std::vector<BucketLayout>& buckets) const;
  void on_gradient(size_t parameter);
  void keep_in_bucket(size_t parameter);
  void mark_ready(size_t parameter);
  void launch_ready_buckets();
  void launch_next_bucket();
  void take_into_bucket(size_t parameter);
  void settle_released(size_t in_flight);
  void flush_released();
  void end_micro_step();
  void make_receiving_buffers();
  void average_parts_across_replicas();
  at::Tensor receiving_part(size_t bucket) const;

  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> grad_views_;  // each parameter's gradient within its bucket
  std::vector<size_t> bucket_of_;       // parameter index -> bucket index
  std::vector<size_t> member_of_;       // parameter index -> its place among its bucket's members
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> averaged_parts_;
  std::vector<at::Tensor> receiving_;  // released: where a micro-step's parts arrive, in turn
  Communicator& communicator_;
  ReducerOptions options_;
  bool sync_ = true;
  size_t next_to_launch_ = 0;
  size_t next_to_settle_ = 0;  // released: the oldest bucket launched and not yet waited for
  bool received_any_ = false;  // released: a gradient arrived since the last micro-step ended
  std::atomic<int64_t> copied_in_ = 0;
  std::mutex mutex_;
};

// dist.overlap ("auto", "true" or "false"): whether gradients on `device` are all-reduced while
// backward runs. auto overlaps where a collective progresses on its own: on CUDA, where NCCL runs
// it on its own stream. An MPI rank on the CPU advances a collective only inside its MPI calls, so
// a bucket launched early is reduced at the end of backward all the same, and launching and
// polling it during backward only takes the rank's cores: 2 ranks of 1 thread reached 0.84 of one
// rank's tokens/s without overlap and 0.71 with it (bench/RESULTS.md; 0.86 and 0.79 on another
// CPU).
bool overlap_all_reduce(const std::string& overlap, c10::Device device);

}  // namespace mltrain
