// The README's set-up on a machine without a CUDA toolkit, which is what a fresh machine is: the
// machines here have one at /usr/local/cuda, so tests/launch/without_cuda_toolkit.sh hides it in a
// mount namespace. There, launch/setup.sh, a configure and a build of mltrain must work with the
// toolkit that setup.sh installs from PyPI, and the binary must run.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;

// `command`, run by bash where no CUDA toolkit is.
CommandResult run_without_cuda_toolkit(const std::string& command) {
  return testing::run_command(fmt::format(
      "bash {}/tests/launch/without_cuda_toolkit.sh bash -c '{}'", MLTRAIN_SOURCE_DIR, command));
}

TEST(FreshMachine, SetsUpBuildsAndRunsWithoutACudaToolkit) {
  if (::geteuid() != 0 || testing::run_command("unshare --mount true").exit_code != 0)
    GTEST_SKIP() << "hiding the CUDA toolkit takes root and a mount namespace (unshare --mount)";
  const std::string source = MLTRAIN_SOURCE_DIR;
  // Inside this build's tree, at the same place in every clone: ccache, which takes paths relative
  // to the checkout, then serves CI's next run of this test from its first.
  const std::string build =
      (std::filesystem::path(MLTRAIN_BIN_DIR).parent_path() / "without-cuda-toolkit").string();
  // The set-up of this build's virtualenv (MLTRAIN_HOME/venv/bin/python), whose toolkit CMake
  // takes first.
  const std::filesystem::path venv =
      std::filesystem::path(MLTRAIN_PYTHON).parent_path().parent_path();
  const std::string mltrain_home = venv.parent_path().string();
  const std::string toolkit = (venv / "cuda").string();

  const CommandResult set_up = run_without_cuda_toolkit(
      // A configure from scratch each time (the cache goes, the objects stay).
      fmt::format("MLTRAIN_HOME={3} bash {0}/launch/setup.sh && rm -f {1}/CMakeCache.txt && "
                  "cmake -S {0} -B {1} -G Ninja -DMLTRAIN_WERROR=ON "
                  "-DBUILD_TESTING=OFF -DMLTRAIN_PYTHON={2} && ninja -C {1} mltrain",
                  source, build, MLTRAIN_PYTHON, mltrain_home));
  ASSERT_EQ(set_up.exit_code, 0) << set_up.output;
  EXPECT_CONTAINS(set_up.output, "[setup] CUDA toolkit: " + toolkit);
  EXPECT_CONTAINS(set_up.output, "Found CUDAToolkit: " + toolkit + "/include");

  // Every library the binary needs is found, CUDA's runtime in that toolkit, and it runs: a dry
  // run builds the smoke model on the CPU through LibTorch.
  const CommandResult ran = run_without_cuda_toolkit(fmt::format(
      "ldd {0}/bin/mltrain && {0}/bin/mltrain {1}/configs/smoke.yaml --dry-run", build, source));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_EQ(ran.output.find("not found"), std::string::npos) << ran.output;
  EXPECT_CONTAINS(ran.output, "libcudart.so.13 => " + toolkit + "/lib64/libcudart.so.13");
  EXPECT_CONTAINS(ran.output, "dry run: the config is valid and the model builds");
}

}  // namespace
}  // namespace mltrain
