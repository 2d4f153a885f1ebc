#include "dist/hybrid_communicator.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace mltrain {
namespace {

// An all-reduce average within the group, then of its result across the replicas: the second
// starts only when the first is waited for (on CUDA, enqueued behind it).
class ThenAcrossReplicas : public CollectiveWork {
 public:
  ThenAcrossReplicas(std::unique_ptr<CollectiveWork> within, Communicator& replicas,
                     at::Tensor result)
      : within_(std::move(within)), replicas_(replicas), result_(std::move(result)) {}

  void wait() override {
    if (within_) {
      within_->wait();
      within_.reset();
      across_ = replicas_.all_reduce_average(result_);
    }
    across_->wait();
  }
  bool completes_on_wait() const override {
    return within_ ? within_->completes_on_wait() : across_->completes_on_wait();
  }

 private:
  std::unique_ptr<CollectiveWork> within_;
  Communicator& replicas_;
  at::Tensor result_;
  std::unique_ptr<CollectiveWork> across_;
};

class HybridCommunicator : public Communicator {
 public:
  HybridCommunicator(std::shared_ptr<FlightRecorder> flight, std::unique_ptr<Communicator> shard,
                     std::unique_ptr<Communicator> replicas)
      : Communicator(std::move(flight), MadeOfOthers{}),
        shard_(std::move(shard)),
        replicas_(std::move(replicas)) {}

  int rank() const override { return shard_->rank(); }
  int size() const override { return shard_->size(); }
  int run_rank() const override { return replicas_->rank() * shard_->size() + shard_->rank(); }

  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return shard_->start_all_reduce_sum(value);
  }
  std::unique_ptr<CollectiveWork> average_across_replicas(const at::Tensor& part) override {
    return replicas_->all_reduce_average(part);
  }
  std::unique_ptr<Communicator> group(const RankGroup&) override {
    throw std::logic_error("a hybrid communicator's groups are made from the run's communicator");
  }

 protected:
  std::unique_ptr<CollectiveWork> start_all_reduce_average(const at::Tensor& tensor,
                                                           int64_t) override {
    return std::make_unique<ThenAcrossReplicas>(shard_->all_reduce_average(tensor), *replicas_,
                                                tensor);
  }
  std::unique_ptr<CollectiveWork> start_reduce_scatter_average(const at::Tensor& input,
                                                               const at::Tensor& output,
                                                               int64_t) override {
    return shard_->reduce_scatter_average(input, output);
  }
  std::unique_ptr<CollectiveWork> start_all_gather(const at::Tensor& tensor, int64_t) override {
    return shard_->all_gather(tensor);
  }
  std::unique_ptr<CollectiveWork> start_broadcast(const at::Tensor& tensor, int root,
                                                  int64_t) override {
    shard_->broadcast(tensor, root);
    return completed_work();
  }

 private:
  std::unique_ptr<Communicator> shard_;
  std::unique_ptr<Communicator> replicas_;
};

}  // namespace

std::unique_ptr<Communicator> make_hybrid_communicator(Communicator& ranks, int shard_ranks) {
  if (shard_ranks < 1 || ranks.size() % shard_ranks != 0) {
    throw std::invalid_argument(
        fmt::format("{} ranks do not split into groups of {}", ranks.size(), shard_ranks));
  }
  const int rank = ranks.rank();
  const int groups = ranks.size() / shard_ranks;
  auto shard = ranks.group({.name = "shard",
                            .color = rank / shard_ranks,
                            .rank = rank % shard_ranks,
                            .size = shard_ranks});
  auto replicas = ranks.group(
      {.name = "replica", .color = rank % shard_ranks, .rank = rank / shard_ranks, .size = groups});
  return std::make_unique<HybridCommunicator>(ranks.shared_flight(), std::move(shard),
                                              std::move(replicas));
}

}  // namespace mltrain
