#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace mltrain {

// Averages gradients over the ranks while backward runs, as PyTorch's DDP reducer does.
// Parameters are packed, in reverse registration order (roughly the order backward produces their
// gradients), into flat buckets: the first of about first_bucket_mb so that communication starts
// early, the rest of about bucket_mb. Each parameter's .grad is a view into its bucket, so
// backward accumulates straight into the buffer that is all-reduced: no copies. A hook after each
// parameter's gradient accumulation counts the bucket down; when a bucket is complete it is
// all-reduced at once (overlap) and in bucket order on every rank, while backward goes on.
// Anything that replaces a .grad instead of accumulating into it (Module::zero_grad(), which
// leaves it undefined; a sparse gradient; backward with create_graph, which accumulates out of
// place) would have the bucket averaged while the optimizer reads the local gradient, and the
// ranks would drift apart. As in DDP's reducer, the same hook and finish() check that each .grad
// is still its bucket view and, where not, copy the gradient into the bucket and restore the view.
//
// Sharded (ZeRO-1, as llm.c and DeepSpeed's stage 1 do it): each bucket is cut into one equal part
// per rank (padded with zeros to a multiple of the ranks), and is reduce-scattered instead of
// all-reduced, so that each rank receives the average of its own part only. The parameters move
// into flat buckets of the same layout (each parameter becomes a view into its bucket), so that
// each rank can update its part of every bucket in place and gather_parameters() can all-gather
// the buckets back into the model with no copies.
struct ReducerOptions {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;  // small, so that the first collective starts early in backward
  bool overlap = true;           // launch each bucket as soon as its gradients are complete
  bool compress_bf16 = false;    // buckets travel as bf16 (half the bytes), averaged in bf16
  bool shard = false;            // ZeRO-1: reduce-scatter, each rank keeps its part
};

class GradReducer {
 public:
  GradReducer(std::vector<at::Tensor> parameters, Communicator& communicator,
              ReducerOptions options);
  ~GradReducer();

  // Where one parameter lies in its bucket.
  struct Member {
    size_t parameter;  // index into the reducer's parameter list
    int64_t offset;    // first element in the bucket
  };
  // This rank's part of one bucket, when sharded.
  struct BucketShard {
    std::vector<Member> members;  // the bucket's parameters
    int64_t begin = 0;            // first element of this rank's part in the bucket
    int64_t elements = 0;         // of the part (every rank's part is as long)
    at::Tensor parameters;        // the part of the flat parameters: update it in place
    at::Tensor gradients;         // the average of the part's gradients, after finish()
    at::Tensor bucket;            // the whole flat parameters of the bucket
  };
  // One per bucket, in the order of the buckets; empty unless sharded.
  const std::vector<BucketShard>& shards() const { return shards_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

  // Sharded: copies every rank's updated part of the parameters to every rank, and waits for it.
  void gather_parameters();

  // Whether the coming backward communicates: off for the micro-steps of gradient accumulation
  // before the last one (their gradients only accumulate locally).
  void set_sync(bool sync) { sync_ = sync; }

  // After the last micro-step's backward: waits for every bucket, launching those not yet launched
  // (all of them without overlap) one at a time, and readies the counters for the next step.
  void finish();

  // Zeroes the gradients in place (they must stay views into the buckets).
  void zero_grad();

  // How many gradients were found replaced and copied back into their buckets.
  int64_t gradients_copied_in() const { return copied_in_; }

 private:
  struct Bucket {
    at::Tensor buffer;               // flat gradients of its parameters
    std::vector<size_t> parameters;  // indices into the reducer's parameter list
    std::vector<int64_t> offsets;    // each parameter's first element in buffer
    size_t pending = 0;              // gradients still to arrive in this backward
    at::Tensor wire;                 // bf16 twin all-reduced in place of buffer, when compressing
    at::Tensor wire_part;            // bf16 twin of this rank's part, when compressing and sharded
    std::unique_ptr<CollectiveWork> work;
  };

  void on_gradient(size_t parameter);
  void keep_in_bucket(size_t parameter);
  void mark_ready(size_t parameter);
  void launch_ready_buckets();
  void launch_next_bucket();
  void shard_bucket(size_t bucket);

  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> grad_views_;  // each parameter's gradient within its bucket
  std::vector<size_t> bucket_of_;       // parameter index -> bucket index
  std::vector<Bucket> buckets_;
  std::vector<BucketShard> shards_;
  Communicator& communicator_;
  ReducerOptions options_;
  bool sync_ = true;
  size_t next_to_launch_ = 0;
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
