// The README's set-up on a machine without a CUDA toolkit, which is what a fresh machine is: the
// machines here have one at /usr/local/cuda, so tests/launch/without_cuda_toolkit.sh hides it in a
// mount namespace. There, launch/setup.sh and a configure must work with the toolkit that setup.sh
// installs from PyPI, nvcc from it must compile the CUDA kernels, and mltrain must run.
//
// What compiles the rest is proved without compiling it again (that took minutes of a first test
// run, issue 46): the configure there includes the same headers as this build's, whose mltrain
// runs there.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;

// `command`, run by bash where no CUDA toolkit is.
CommandResult run_without_cuda_toolkit(const std::string& command) {
  return testing::run_command(fmt::format(
      "bash {}/tests/launch/without_cuda_toolkit.sh bash -c '{}'", MLTRAIN_SOURCE_DIR, command));
}

// The include directories of `source_file`'s compile in `build`'s compile_commands.json, in order
// (a system include of this build's tree named from the build's own folder).
std::string include_dirs_of(const std::filesystem::path& build, const std::string& source_file) {
  std::ifstream in(build / "compile_commands.json");
  for (const auto& entry : nlohmann::json::parse(in)) {
    if (entry["file"].get<std::string>().ends_with(source_file)) {
      const std::string command = entry["command"].get<std::string>();
      const std::regex include(R"((-I|-isystem )(\S+))");
      std::string dirs;
      for (auto it = std::sregex_iterator(command.begin(), command.end(), include);
           it != std::sregex_iterator(); ++it) {
        std::string dir = (*it)[2].str();
        if (dir.starts_with(build.string())) dir = "BUILD" + dir.substr(build.string().size());
        dirs += dir + "\n";
      }
      return dirs;
    }
  }
  return "";
}

TEST(FreshMachine, SetsUpBuildsAndRunsWithoutACudaToolkit) {
  if (::geteuid() != 0 || testing::run_command("unshare --mount true").exit_code != 0)
    GTEST_SKIP() << "hiding the CUDA toolkit takes root and a mount namespace (unshare --mount)";
  const std::string source = MLTRAIN_SOURCE_DIR;
  const std::filesystem::path this_build = std::filesystem::path(MLTRAIN_BIN_DIR).parent_path();
  // Inside this build's tree, at the same place in every clone.
  const std::filesystem::path build = this_build / "without-cuda-toolkit";
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
                  "-DBUILD_TESTING=OFF -DMLTRAIN_PYTHON={2} && ninja -C {1} mltrain_cuda_launch",
                  source, build.string(), MLTRAIN_PYTHON, mltrain_home));
  ASSERT_EQ(set_up.exit_code, 0) << set_up.output;
  EXPECT_CONTAINS(set_up.output, "[setup] CUDA toolkit: " + toolkit);
  EXPECT_CONTAINS(set_up.output, "Found CUDAToolkit: " + toolkit + "/include");
  // The CUDA kernels' launches, from nvcc of that toolkit.
  EXPECT_TRUE(std::filesystem::exists(build / "model" / "libmltrain_cuda_launch.a"));
  // The C++ compiles there take the headers this build's took, LibTorch's and the toolkit's.
  const std::string there = include_dirs_of(build, "model/kernels/cuda_kernels.cpp");
  EXPECT_CONTAINS(there, toolkit + "/include");
  EXPECT_EQ(there, include_dirs_of(this_build, "model/kernels/cuda_kernels.cpp"));

  // Every library this build's binary needs is found there, CUDA's runtime in that toolkit, and
  // it runs: a dry run builds the smoke model on the CPU through LibTorch.
  const CommandResult ran = run_without_cuda_toolkit(fmt::format(
      "ldd {0}/mltrain && {0}/mltrain {1}/configs/smoke.yaml --dry-run", MLTRAIN_BIN_DIR, source));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_EQ(ran.output.find("not found"), std::string::npos) << ran.output;
  EXPECT_CONTAINS(ran.output, "libcudart.so.13 => " + toolkit + "/lib64/libcudart.so.13");
  EXPECT_CONTAINS(ran.output, "dry run: the config is valid and the model builds");
}

}  // namespace
}  // namespace mltrain
