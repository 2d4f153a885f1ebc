// Data-parallel training across ranks: run by ctest under `mpirun -n 2` on the CPU (MPI backend).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/file_tree.h"
#include "dist/communicator.h"
#include "dist/world.h"
#include "model/interop/safetensors.h"
#include "tests/dist/mpi_test_world.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/run/training_run.h"

namespace mltrain {
namespace {

const World& world = testing::mpi_world;

// A directory both ranks see, emptied by rank 0 before the test.
std::filesystem::path shared_directory(Communicator& communicator) {
  const std::filesystem::path directory = testing::mpi_test_directory();
  if (world.rank == 0) {
    remove_tree(directory);
    std::filesystem::create_directories(directory);
    testing::write_learnable_stream(directory / "train_000000.bin", 20000);
    testing::write_learnable_stream(directory / "val_000000.bin", 2000);
  }
  communicator.all_reduce_sum(0.0);  // the others wait for it
  return directory;
}

Config run_in(const std::filesystem::path& directory, const std::string& run, int64_t micro_batch) {
  Config config = testing::tiny_run(directory);
  config.train.max_steps = 12;
  config.train.run_dir = (directory / run).string();
  config.data.micro_batch = micro_batch;
  config.dist.bucket_mb = 0.02;  // several buckets even for the tiny model
  return config;
}

NamedTensors final_weights(const std::filesystem::path& directory, const std::string& run) {
  return load_safetensors(directory / run / "checkpoints" / "step_00000012" / "model.safetensors");
}

TEST(SameOnAllRanks, TellsEqualFromDifferentTensors) {
  ASSERT_EQ(world.size, 2) << "run under mpirun -n 2";
  const auto communicator = make_communicator(world);
  EXPECT_TRUE(same_on_all_ranks({at::arange(10.0)}, *communicator));
  EXPECT_FALSE(same_on_all_ranks({at::arange(10.0) + world.rank}, *communicator));
}

TEST(MpiTraining, TwoRanksTrainLikeOneRankWithTheWholeBatch) {
  ASSERT_EQ(world.size, 2) << "run under mpirun -n 2";
  const auto communicator = make_communicator(world);
  const std::filesystem::path directory = shared_directory(*communicator);

  // Two ranks of 4 windows per micro-step, with and without overlapping the all-reduce. Every
  // checkpoint first checks that the ranks hold the same weights (it throws if not).
  Config overlap = run_in(directory, "overlap", 4);
  overlap.dist.overlap = "true";
  train(overlap, "", world);
  Config no_overlap = run_in(directory, "no_overlap", 4);
  no_overlap.dist.overlap = "false";
  train(no_overlap, "", world);
  // One rank of 8 windows: the same global batch.
  if (world.rank == 0) train(run_in(directory, "one_rank", 8), "", World());
  communicator->all_reduce_sum(0.0);

  if (world.rank == 0) {
    const NamedTensors overlapped = final_weights(directory, "overlap");
    const NamedTensors sequential = final_weights(directory, "no_overlap");
    const NamedTensors single = final_weights(directory, "one_rank");
    for (const auto& [name, tensor] : overlapped) {
      EXPECT_TRUE(at::equal(tensor, sequential.at(name))) << name << ": overlap on and off differ";
      EXPECT_LE(testing::relative_error(tensor, single.at(name)), 1e-6)
          << name << ": two ranks and one differ";
    }
  }
}

// With loss masks every rank's loss and gradients are divided by the targets of the whole step,
// which each rank counts alone: two ranks of 4 windows train as one rank of 8.
TEST(MpiTraining, TwoRanksTrainOnMaskedTargetsLikeOneRank) {
  ASSERT_EQ(world.size, 2) << "run under mpirun -n 2";
  const auto communicator = make_communicator(world);
  const std::filesystem::path directory = shared_directory(*communicator);
  if (world.rank == 0) testing::write_masked_learnable_corpus(directory / "chat");
  communicator->all_reduce_sum(0.0);
  const auto masked_run = [&](const std::string& run, int64_t micro_batch) {
    Config config = run_in(directory, run, micro_batch);
    config.data.train = (directory / "chat" / "train_*.bin").string();
    config.data.val = (directory / "chat" / "val_*.bin").string();
    return config;
  };
  train(masked_run("masked_two", 4), "", world);
  if (world.rank == 0) train(masked_run("masked_one", 8), "", World());
  communicator->all_reduce_sum(0.0);
  if (world.rank == 0) {
    const NamedTensors two = final_weights(directory, "masked_two");
    const NamedTensors one = final_weights(directory, "masked_one");
    for (const auto& [name, tensor] : two)
      EXPECT_LE(testing::relative_error(tensor, one.at(name)), 1e-6) << name;
  }
}

TEST(MpiTraining, ACheckpointOfTwoRanksResumesOnOne) {
  ASSERT_EQ(world.size, 2) << "run under mpirun -n 2";
  const auto communicator = make_communicator(world);
  const std::filesystem::path directory = shared_directory(*communicator);
  train(run_in(directory, "unbroken", 4), "", world);
  Config first_half = run_in(directory, "moved", 4);
  first_half.train.stop_at = 5;
  train(first_half, "", world);
  // The same global batch on one rank reads the same samples: the run goes on where it stopped.
  if (world.rank == 0) train(run_in(directory, "moved", 8), "auto", World());
  communicator->all_reduce_sum(0.0);

  if (world.rank == 0) {
    const NamedTensors unbroken = final_weights(directory, "unbroken");
    const NamedTensors moved = final_weights(directory, "moved");
    for (const auto& [name, tensor] : unbroken) {
      EXPECT_LE(testing::relative_error(moved.at(name), tensor), 1e-6) << name;
    }
  }
}

}  // namespace
}  // namespace mltrain
