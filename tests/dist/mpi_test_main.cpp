// main() of the tests that ctest starts as several ranks under mpirun.
#include <gtest/gtest.h>

#include "tests/dist/mpi_test_world.h"

namespace mltrain::testing {
World mpi_world;
}

int main(int argc, char** argv) {
  mltrain::testing::mpi_world = mltrain::init_world(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  mltrain::finalize_world(mltrain::testing::mpi_world);
  return failed;
}
