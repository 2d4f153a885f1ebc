// mlgen's command line as a user meets it: what it prints and how it exits. (Generating from a
// trained run is in smoke_run_test.cpp.)
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;

CommandResult mlgen(const std::string& arguments) {
  std::string command = MLTRAIN_BIN_DIR "/mlgen ";
  command += arguments;
  return testing::run_command(command);
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The arguments are checked before the run directory is read, so none of these needs a run.
TEST(MlgenCli, BadArgumentsAreOneLineAndExitTwo) {
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "no run directory given (see mlgen --help)"},
           {"runs/x --temperature 0.7", "unknown option --temperature (see mlgen --help)"},
           {"--temperature 0.7", "unknown option --temperature (see mlgen --help)"},
           {"runs/x runs/y", "unexpected argument runs/y (see mlgen --help)"},
           {"runs/x --tokens lots",
            "--tokens: expected a positive integer, got \"lots\" (see mlgen --help)"},
           {"runs/x --tokens 0", "--tokens: expected a positive integer, got \"0\""},
           {"runs/x --tokens 1.5", "--tokens: expected a positive integer, got \"1.5\""},
           {"runs/x --prompt", "--prompt: 1 required TEXT missing (see mlgen --help)"}}) {
    const CommandResult run = mlgen(arguments);
    EXPECT_EQ(run.exit_code, kExitUserError) << arguments;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(lines(run.output), 1u) << run.output;
  }
}

TEST(MlgenCli, HelpListsEveryFlagAndExitsZero) {
  const CommandResult run = mlgen("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_CONTAINS(run.output, "Usage: mlgen [OPTIONS] RUN_DIR");
  for (const char* flag : {"-h,--help", "--prompt TEXT", "--tokens N"})
    EXPECT_CONTAINS(run.output, flag);
  EXPECT_CONTAINS(run.output, "newest checkpoint");
}

}  // namespace
}  // namespace mltrain
