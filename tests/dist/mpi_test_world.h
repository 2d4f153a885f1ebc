#pragma once

#include "dist/world.h"

namespace mltrain::testing {

// The world of a test started under mpirun (see mpi_test_main.cpp).
extern World mpi_world;

}  // namespace mltrain::testing
