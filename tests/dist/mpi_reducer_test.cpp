// The gradient reducer and the communicator's deadlines across ranks: run by ctest under
// `mpirun -n 2` on the CPU (MPI backend).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>

#include <chrono>
#include <set>
#include <thread>

#include "dist/grad_reducer.h"
#include "dist/mpi_polling.h"
#include "dist/world.h"
#include "model/layers/llama.h"
#include "tests/dist/mpi_test_world.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

const World& world = testing::mpi_world;

// Gradients of a tiny model on `windows`, the same initial weights on every rank.
std::vector<at::Tensor> reduced_gradients(const World& ranks, const at::Tensor& windows,
                                          bool overlap, int64_t micro_steps,
                                          bool compress_bf16 = false) {
  at::manual_seed(7);
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  const auto communicator = make_communicator(ranks);
  GradReducer reducer(
      model->parameters(),
      assign_buckets(model->parameters(), {.bucket_mb = 0.05, .first_bucket_mb = 0.01}),
      *communicator, {.overlap = overlap, .compress_bf16 = compress_bf16});
  std::set<const void*> buckets;  // each bucket is the storage of its parameters' gradients
  for (const at::Tensor& parameter : model->parameters())
    buckets.insert(parameter.grad().storage().data());
  EXPECT_GT(buckets.size(), 3u) << "the test should cover several buckets";
  const int64_t rows = windows.size(0) / micro_steps;
  for (int64_t micro = 0; micro < micro_steps; ++micro) {
    reducer.set_sync(micro + 1 == micro_steps);
    const at::Tensor part = windows.narrow(0, micro * rows, rows);
    (next_token_loss(model(part.narrow(1, 0, 16)), part.narrow(1, 1, 16)) /
     static_cast<double>(micro_steps))
        .backward();
  }
  reducer.finish();
  std::vector<at::Tensor> grads;
  for (const at::Tensor& parameter : model->parameters()) grads.push_back(parameter.grad().clone());
  return grads;
}

TEST(MpiGradReducer, AveragesGradientsOverRanksAsOneLargeBatch) {
  ASSERT_EQ(world.size, 2) << "run under mpirun -n 2";
  at::manual_seed(3);
  const at::Tensor all =
      at::randint(testing::tiny_config().vocab_size, {8, 17});  // the same on both ranks
  const at::Tensor mine = all.narrow(0, 4 * world.rank, 4);

  const auto with_overlap = reduced_gradients(world, mine, /*overlap=*/true, /*micro_steps=*/2);
  const auto without_overlap = reduced_gradients(world, mine, /*overlap=*/false, 2);
  const auto single_rank = reduced_gradients(World(), all, true, 2);  // one rank, the whole batch

  for (size_t i = 0; i < with_overlap.size(); ++i) {
    EXPECT_TRUE(at::equal(with_overlap[i], without_overlap[i])) << "parameter " << i;
    EXPECT_LE(testing::relative_error(with_overlap[i], single_rank[i]), 1e-6) << "parameter " << i;
  }
  // bf16 on the wire: the same average to bf16 precision, and still the same on both ranks.
  const auto compressed = reduced_gradients(world, mine, true, 2, /*compress_bf16=*/true);
  for (size_t i = 0; i < compressed.size(); ++i) {
    EXPECT_LE(testing::relative_error(compressed[i], with_overlap[i]), 1e-2) << "parameter " << i;
    EXPECT_GT(testing::relative_error(compressed[i], with_overlap[i]), 0.0)
        << "parameter " << i << " was not compressed";
  }
  // Both ranks hold the same averaged gradients, bit for bit.
  const auto communicator = make_communicator(world);
  EXPECT_TRUE(same_on_all_ranks(with_overlap, *communicator));
  EXPECT_TRUE(same_on_all_ranks(compressed, *communicator));
}

// A .grad replaced on one rank (Module::zero_grad() leaves it undefined) must still be averaged:
// were it left out of its bucket, that rank would step with its local gradient.
TEST(MpiGradReducer, AveragesAGradientThatWasReplaced) {
  torch::nn::Linear layer(torch::nn::LinearOptions(3, 2).bias(false));
  const auto communicator = make_communicator(world);
  GradReducer reducer(layer->parameters(), assign_buckets(layer->parameters(), {.bucket_mb = 1.0}),
                      *communicator, {});
  const at::Tensor weight = layer->weight;
  const at::Tensor bucket_view = weight.grad();
  if (world.rank == 1) layer->zero_grad();  // .grad undefined on one rank only
  // d/dW of (rank + 1) * sum(W x) is (rank + 1) x^T: averaged over ranks 0 and 1, 1.5 x^T.
  const at::Tensor x = at::tensor({1.f, 2.f, 3.f});
  (static_cast<double>(world.rank + 1) * layer(x).sum()).backward();
  reducer.finish();
  EXPECT_TRUE(at::allclose(weight.grad(), 1.5 * x.expand({2, 3})));
  EXPECT_TRUE(weight.grad().is_alias_of(bucket_view));
  EXPECT_EQ(reducer.gradients_copied_in(), world.rank == 1 ? 1 : 0);
}

// Every host-side MPI wait ends at dist.timeout_s, naming what it waited for, when a rank is late.
TEST(MpiDeadline, AWaitForALateRankEndsNamingTheOperation) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (world.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &request), "MPI_Ibarrier");
  if (world.rank == 0) {
    try {
      wait_for(request, 0.2, "the test's barrier");
      ADD_FAILURE() << "rank 1 joins after 1.5 s: the wait must end at 0.2 s";
    } catch (const std::runtime_error& error) {
      EXPECT_CONTAINS(std::string(error.what()),
                      "the test's barrier did not finish within dist.timeout_s = 0.2 s");
    }
  }
  wait_for(request, 60.0, "the test's barrier");  // both ranks leave it complete
}

}  // namespace
}  // namespace mltrain
