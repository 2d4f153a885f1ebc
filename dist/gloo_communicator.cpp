#include "dist/gloo_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <stdexcept>
#include <utility>

#include "dist/summed_work.h"

namespace mltrain {
namespace {

class GlooSum : public PendingSum {
 public:
  GlooSum(std::unique_ptr<CollectiveWork> work, at::Tensor value)
      : work_(std::move(work)), value_(std::move(value)) {}
  double wait() override {
    work_->wait();
    return value_.item<double>();
  }

 private:
  std::unique_ptr<CollectiveWork> work_;
  at::Tensor value_;
};

void check_gloo_tensor(const at::Tensor& tensor, const char* collective) {
  if (!tensor.is_cpu() || !tensor.is_contiguous())
    throw std::invalid_argument(fmt::format("Gloo {} needs a contiguous CPU tensor", collective));
}

// Over the ranks that meet under `prefix` in `store`: every rank of the run, or a group's.
class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(int rank, int size, c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                   double timeout_s, std::shared_ptr<FlightRecorder> flight)
      : Communicator(std::move(flight)),
        rank_(rank),
        size_(size),
        store_(std::move(store)),
        prefix_(std::move(prefix)),
        timeout_s_(timeout_s) {
    auto options = c10d::ProcessGroupGloo::Options::create(
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    // Every rank has met at the store (rendezvous_store.h): what fails here is a connection
    // between two of them, and c10d's line ("wait timeout ... keys: /mltrain/gloo/0/1") says
    // only which key it waited for.
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix_, store_), rank_, size_, options);
    } catch (const std::exception& error) {
      const std::string what = error.what();
      throw std::runtime_error(fmt::format(
          "rank {} of {}: Gloo could not connect the ranks within dist.timeout_s = {} s, though "
          "all {} had checked in at the rendezvous (a rank failed or left since, and its own "
          "error says why; or its address is not reachable from this one): {}",
          rank_, size_, timeout_s, size_, what.substr(0, what.find('\n'))));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Communicator> group(const RankGroup& group) override {
    return std::make_unique<GlooCommunicator>(
        group.rank, group.size, store_, fmt::format("{}/{}/{}", prefix_, group.name, group.color),
        timeout_s_, shared_flight());
  }

  std::unique_ptr<PendingSum> start_all_reduce_sum(double value) override {
    return recorded_sum([&] {
      at::Tensor sum = at::full({1}, value, at::kDouble);
      std::vector<at::Tensor> tensors{sum};
      return std::make_unique<GlooSum>(
          started(group_->allreduce(tensors), "the sum of a host value", at::Tensor(), {}), sum);
    });
  }

 protected:
  std::unique_ptr<CollectiveWork> start_all_reduce_average(const at::Tensor& tensor,
                                                           int64_t) override {
    check_gloo_tensor(tensor, "all-reduce");
    std::vector<at::Tensor> tensors{tensor};
    return started(group_->allreduce(tensors), collective_name("all-reduce", tensor), tensor, {});
  }

  std::unique_ptr<CollectiveWork> start_reduce_scatter_average(const at::Tensor& input,
                                                               const at::Tensor& output,
                                                               int64_t) override {
    check_gloo_tensor(input, "reduce-scatter");
    check_gloo_tensor(output, "reduce-scatter");
    check_scatter_shapes(input, output, size_);
    at::Tensor in = input;
    at::Tensor out = output;
    return started(group_->_reduce_scatter_base(out, in), collective_name("reduce-scatter", input),
                   output, {input});
  }

  std::unique_ptr<CollectiveWork> start_all_gather(const at::Tensor& tensor, int64_t) override {
    check_gloo_tensor(tensor, "all-gather");
    const int64_t part = part_numel(tensor, size_);
    // Gloo reads the rank's part from a buffer of its own, not from inside the output.
    at::Tensor own = tensor.view(-1).narrow(0, rank_ * part, part).clone();
    at::Tensor whole = tensor.view(-1);
    return started(group_->_allgather_base(whole, own), collective_name("all-gather", tensor),
                   at::Tensor(), {own, tensor});
  }

  std::unique_ptr<CollectiveWork> start_broadcast(const at::Tensor& tensor, int root,
                                                  int64_t) override {
    check_gloo_tensor(tensor, "broadcast");
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    return started(group_->broadcast(tensors, options), collective_name("broadcast", tensor),
                   at::Tensor(), {});
  }

 private:
  // Gloo's operation `work`, named `name`: its wait rethrows a failure or a timeout naming it.
  std::unique_ptr<CollectiveWork> started(c10::intrusive_ptr<c10d::Work> work, std::string name,
                                          at::Tensor average, std::vector<at::Tensor> in_flight) {
    return std::make_unique<SummedWork>(
        [work = std::move(work), name = std::move(name), timeout_s = timeout_s_] {
          try {
            work->wait();
          } catch (const std::exception& error) {
            const std::string what = error.what();
            throw std::runtime_error(fmt::format(
                "{} failed or did not finish within dist.timeout_s = {} s (a rank is behind, "
                "stopped or gone): {}",
                name, timeout_s, what.substr(0, what.find('\n'))));
          }
        },
        std::move(average), size_, std::move(in_flight));
  }

  int rank_;
  int size_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  double timeout_s_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const World& world,
                                                     c10::intrusive_ptr<c10d::Store> store,
                                                     double timeout_s,
                                                     std::shared_ptr<FlightRecorder> flight) {
  return std::make_unique<GlooCommunicator>(world.rank, world.size, std::move(store),
                                            "mltrain/gloo", timeout_s, std::move(flight));
}

}  // namespace mltrain
