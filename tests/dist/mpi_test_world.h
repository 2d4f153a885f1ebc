#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "dist/world.h"

namespace mltrain::testing {

// The world of a test started under mpirun (see mpi_test_main.cpp).
extern World mpi_world;

// A directory every rank of the test sees, named by ctest (one per number of ranks).
inline std::filesystem::path mpi_test_directory() {
  const char* directory = std::getenv("MLTRAIN_MPI_TEST_DIR");
  if (directory == nullptr)
    throw std::runtime_error("MLTRAIN_MPI_TEST_DIR is not set (run by ctest)");
  return directory;
}

}  // namespace mltrain::testing
