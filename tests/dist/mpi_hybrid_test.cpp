// Hybrid sharding's communicator (dist.shard_ranks) and the groups it is made of: run by ctest
// under `mpirun -n 4` (2 groups of 2) and `mpirun -n 6` (3 groups of 2) on the CPU (MPI backend).
// Every expected value is a closed form of the ranks' numbers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dist/communicator.h"
#include "dist/flight_recorder.h"
#include "dist/hybrid_communicator.h"
#include "dist/world.h"
#include "tests/dist/mpi_test_world.h"

namespace mltrain {
namespace {

const World& world = testing::mpi_world;
constexpr int kShardRanks = 2;

// Rank `rank`'s values: (rank + 1) times 1, 2, ..., n.
at::Tensor values_of(int rank, int64_t n) {
  return at::arange(1, n + 1, at::kFloat) * static_cast<float>(rank + 1);
}

class HybridCommunicator : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(world.size % kShardRanks, 0) << "run under mpirun -n 4 or 6";
    ASSERT_GT(world.size, kShardRanks) << "run under mpirun -n 4 or 6";
    ranks_ = make_communicator(world);
    hybrid_ = make_hybrid_communicator(*ranks_, kShardRanks);
  }
  int group() const { return world.rank / kShardRanks; }
  int first_of_group() const { return group() * kShardRanks; }

  std::unique_ptr<Communicator> ranks_;
  std::unique_ptr<Communicator> hybrid_;
};

TEST_F(HybridCommunicator, ItsRanksAreTheGroups) {
  EXPECT_EQ(hybrid_->size(), kShardRanks);
  EXPECT_EQ(hybrid_->rank(), world.rank % kShardRanks);
}

// A reduce-scatter averages within the group, each rank getting its group rank's part; averaged
// across the replicas it is the average over every rank.
TEST_F(HybridCommunicator, ReduceScatterAveragesInTheGroupAndTheReplicasCompleteIt) {
  const int64_t part = 3;
  const at::Tensor input = values_of(world.rank, part * kShardRanks);
  const at::Tensor output = at::empty({part});
  hybrid_->reduce_scatter_average(input, output)->wait();
  const at::Tensor ones_to_n = at::arange(1, part * kShardRanks + 1, at::kFloat);
  // The mean of rank + 1 over the group's ranks g K .. g K + K - 1 is g K + (K + 1) / 2.
  const float group_mean = static_cast<float>(first_of_group()) + (kShardRanks + 1) / 2.0F;
  const at::Tensor mine = ones_to_n.narrow(0, hybrid_->rank() * part, part);
  EXPECT_TRUE(at::allclose(output, mine * group_mean)) << output;
  hybrid_->average_across_replicas(output)->wait();
  // Over every rank, 0 .. size - 1: (size + 1) / 2.
  EXPECT_TRUE(at::allclose(output, mine * (world.size + 1) / 2.0F)) << output;
  // The input is not changed.
  EXPECT_TRUE(at::equal(input, values_of(world.rank, part * kShardRanks)));
}

// Without replicas there is nothing to average across.
TEST(Communicator, AveragesAcrossNoReplicasWithoutChangingThePart) {
  const auto ranks = make_communicator(world);
  const at::Tensor part = values_of(world.rank, 4);
  ranks->average_across_replicas(part)->wait();
  EXPECT_TRUE(at::equal(part, values_of(world.rank, 4)));
}

// The run's rank of a group's rank: where rank 0 of the run, which alone keeps a gathered
// optimizer state, is.
TEST_F(HybridCommunicator, KnowsItsRankInTheRun) { EXPECT_EQ(hybrid_->run_rank(), world.rank); }

TEST_F(HybridCommunicator, AllReduceAveragesOverEveryRank) {
  const at::Tensor tensor = values_of(world.rank, 5);
  hybrid_->all_reduce_average(tensor)->wait();
  EXPECT_TRUE(at::allclose(tensor, at::arange(1, 6, at::kFloat) * (world.size + 1) / 2.0F))
      << tensor;
}

// Each rank's part reaches the ranks of its group, and only them.
TEST_F(HybridCommunicator, AllGatherRunsWithinTheGroup) {
  const int64_t part = 4;
  const at::Tensor whole = at::full({part * kShardRanks}, -1.0F);
  whole.narrow(0, hybrid_->rank() * part, part).fill_(static_cast<float>(world.rank));
  hybrid_->all_gather(whole)->wait();
  for (int member = 0; member < kShardRanks; ++member) {
    EXPECT_TRUE(at::equal(whole.narrow(0, member * part, part),
                          at::full({part}, static_cast<float>(first_of_group() + member))))
        << whole;
  }
}

// Host sums and broadcasts run within the group: a norm summed over the parts counts each part
// once, not once per replica.
TEST_F(HybridCommunicator, SumsAndBroadcastsRunWithinTheGroup) {
  const double sum = hybrid_->all_reduce_sum(static_cast<double>(world.rank));
  EXPECT_EQ(sum, kShardRanks * first_of_group() + kShardRanks * (kShardRanks - 1) / 2.0);
  const at::Tensor tensor = at::full({3}, static_cast<float>(world.rank));
  hybrid_->broadcast(tensor, /*root=*/1);
  EXPECT_TRUE(at::equal(tensor, at::full({3}, static_cast<float>(first_of_group() + 1))));
}

// Replicas hold the same part at the same rank of each group: each rank's own tensors, which
// differ within a group, compare equal across the groups; a rank whose part differs from its
// replicas' makes every rank of the run answer no.
TEST_F(HybridCommunicator, ComparesEachPartWithItsReplicas) {
  const int in_group = world.rank % kShardRanks;
  EXPECT_TRUE(same_across_replicas({values_of(in_group, 5)}, *hybrid_, *ranks_));
  at::Tensor part = values_of(in_group, 5);
  if (world.rank == world.size - 1) part[2] += 1;
  EXPECT_FALSE(same_across_replicas({part}, *hybrid_, *ranks_));
}

// The groups' collectives are recorded in the run's flight recorder, each once, and number the
// same on every rank: a failure's flight records line up across the groups.
TEST_F(HybridCommunicator, TheGroupsCollectivesAreRecordedOnceInTheRunsRecorder) {
  const int64_t before = ranks_->flight().last_seq();
  const at::Tensor input = values_of(world.rank, 2 * kShardRanks);
  const at::Tensor output = at::empty({2});
  hybrid_->reduce_scatter_average(input, output)->wait();
  hybrid_->average_across_replicas(output)->wait();
  const int64_t after = ranks_->flight().last_seq();
  EXPECT_EQ(after - before, 2) << "a reduce-scatter in the group, an all-reduce across them";
  const std::vector<FlightEntry> entries = ranks_->flight().entries();
  ASSERT_GE(entries.size(), 2u);
  EXPECT_EQ(entries[entries.size() - 2].op, "reduce-scatter");
  EXPECT_EQ(entries.back().op, "all-reduce");
  EXPECT_EQ(entries.back().numel, 2);
  const double seqs = ranks_->all_reduce_sum(static_cast<double>(after));
  EXPECT_EQ(seqs, static_cast<double>(after) * world.size);
}

TEST(HybridCommunicatorGroups, GroupsThatDoNotDivideTheRanksAreRefused) {
  const auto ranks = make_communicator(world);
  EXPECT_THROW(make_hybrid_communicator(*ranks, world.size + 1), std::invalid_argument);
}

}  // namespace
}  // namespace mltrain
