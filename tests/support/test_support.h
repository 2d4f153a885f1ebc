#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>

// Checks that `text` holds `part`, printing the whole text when it does not.
#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

namespace mltrain::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TemporaryDirectory {
 public:
  TemporaryDirectory();
  ~TemporaryDirectory();
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs a shell command and collects what it printed and how it exited.
CommandResult run_command(const std::string& command);

// Runs one of the project's executables (mltrain, mlgen, mlprep, ...) from the build's bin
// directory with `arguments`, as a shell command line.
CommandResult run_tool(const std::string& executable, const std::string& arguments);

// The same, started in the working directory `directory`.
CommandResult run_tool_in(const std::filesystem::path& directory, const std::string& executable,
                          const std::string& arguments);

// A shell command running in the background, its output going to a file; for tests that signal
// or watch a running process.
class BackgroundProcess {
 public:
  BackgroundProcess(const std::string& command, const std::filesystem::path& output);
  ~BackgroundProcess();  // kills the process if it is still running
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  void signal(int signal_number) const;
  // To the process group the process leads (a command run under setsid), as a terminal signals
  // its foreground job on Ctrl-C.
  void signal_group(int signal_number) const;
  // The exit code (128 + signal when killed by one). A process still running after `timeout` is
  // killed and -1 returned: a test of something that hangs fails instead of stalling the suite.
  int wait(std::chrono::seconds timeout = std::chrono::seconds(300));

 private:
  int pid_;
  bool finished_ = false;
};

void write_text(const std::filesystem::path& path, const std::string& text);
std::string read_text(const std::filesystem::path& path);

// Every regular file under `directory` with its bytes, by path relative to it: two snapshots are
// equal when nothing in the tree was written, added or removed.
std::map<std::string, std::string> file_contents(const std::filesystem::path& directory);

// ||actual - expected|| / ||expected|| in float64.
double relative_error(const at::Tensor& actual, const at::Tensor& expected);

// A TCP port on the loopback that nothing listens on now, for a rendezvous of a test's own.
int free_port();

}  // namespace mltrain::testing
