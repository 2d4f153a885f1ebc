// The gradient reducer across ranks: run by ctest under `mpirun -n 2` on the CPU (MPI backend).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "dist/grad_reducer.h"
#include "dist/world.h"
#include "model/llama.h"
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
  Llama model(testing::tiny_config());
  const auto communicator = make_communicator(ranks);
  GradReducer reducer(model->parameters(), *communicator, /*bucket_mb=*/0.05,
                      /*first_bucket_mb=*/0.01, overlap, compress_bf16);
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

}  // namespace
}  // namespace mltrain
