#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"

// What the fault tests share: the tiny run as a config file, the executables as command lines, and
// waiting for a run in the background to get somewhere.
namespace mltrain::testing {

// A config file for the tiny run, with a constant schedule so that runs of different lengths
// share their learning rates step by step, and every step logged.
inline std::string write_config(const TemporaryDirectory& dir, int64_t max_steps) {
  Config config = tiny_run(dir.path());
  config.optim.schedule = "constant";
  config.train.max_steps = max_steps;
  config.train.log_every = 1;
  config.train.eval_every = 1000000;
  const auto path = dir / "run.yaml";
  write_text(path, config_to_yaml(config));
  return path.string();
}

inline std::string mltrain(const std::string& arguments) {
  return std::string(MLTRAIN_BIN_DIR) + "/mltrain " + arguments;
}

// mltrain_faults with MLTRAIN_FAULT=fault.
inline std::string mltrain_with_fault(const std::string& fault, const std::string& arguments) {
  return "MLTRAIN_FAULT=" + fault + " " + std::string(MLTRAIN_BIN_DIR) + "/mltrain_faults " +
         arguments;
}

// mpirun of `ranks` ranks on the CPU, as root may run it.
inline std::string mpirun(int ranks) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
         std::string(MLTRAIN_MPIEXEC) + " " + std::to_string(ranks);
}

// mltrain_faults on `ranks` CPU ranks of mpirun, each with MLTRAIN_FAULT=fault.
inline std::string mpirun_with_fault(int ranks, const std::string& fault,
                                     const std::string& arguments) {
  return mpirun(ranks) + " -x MLTRAIN_FAULT=" + fault + " " + std::string(MLTRAIN_BIN_DIR) +
         "/mltrain_faults " + arguments;
}

inline int64_t last_logged_step(const std::filesystem::path& metrics) {
  int64_t step = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.contains("loss")) step = record["step"];
  }
  return step;
}

// Waits up to a minute for `ready` to hold.
template <class Ready>
void wait_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!ready() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

inline void wait_for_step(const std::filesystem::path& metrics, int64_t step) {
  wait_until([&] { return last_logged_step(metrics) >= step; });
}

// The step of the checkpoint that RUN_DIR/checkpoints/latest names.
inline int64_t latest_step(const std::filesystem::path& run_dir) {
  return std::stoll(read_text(run_dir / "checkpoints" / "latest").substr(5));
}

}  // namespace mltrain::testing
