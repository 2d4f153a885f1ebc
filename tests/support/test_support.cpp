#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/file_tree.h"

namespace mltrain::testing {

TemporaryDirectory::TemporaryDirectory() {
  std::string pattern = (std::filesystem::temp_directory_path() / "mltrain-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TemporaryDirectory::~TemporaryDirectory() {
  std::error_code ignored;
  remove_tree(path_, ignored);
}

CommandResult run_command(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  std::string output;
  std::array<char, 4096> buffer;
  size_t read = 0;
  while ((read = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    output.append(buffer.data(), read);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

CommandResult run_tool(const std::string& executable, const std::string& arguments) {
  std::string command = MLTRAIN_BIN_DIR "/";
  // Appended rather than concatenated: GCC 12 warns falsely on the latter.
  command += executable;
  command += " ";
  command += arguments;
  return run_command(command);
}

CommandResult run_tool_in(const std::filesystem::path& directory, const std::string& executable,
                          const std::string& arguments) {
  std::string command = "cd '" + directory.string() + "' && " MLTRAIN_BIN_DIR "/";
  command += executable;
  command += " ";
  command += arguments;
  return run_command(command);
}

BackgroundProcess::BackgroundProcess(const std::string& command,
                                     const std::filesystem::path& output) {
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const std::string shell_command = "exec " + command + " >'" + output.string() + "' 2>&1";
    ::execl("/bin/sh", "sh", "-c", shell_command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
}

BackgroundProcess::~BackgroundProcess() {
  if (!finished_) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

void BackgroundProcess::signal(int signal_number) const { ::kill(pid_, signal_number); }

void BackgroundProcess::signal_group(int signal_number) const { ::kill(-pid_, signal_number); }

int BackgroundProcess::wait(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      finished_ = true;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  finished_ = true;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::map<std::string, std::string> file_contents(const std::filesystem::path& directory) {
  std::map<std::string, std::string> contents;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(directory)) {
    if (entry.is_regular_file())
      contents[std::filesystem::relative(entry.path(), directory).string()] =
          read_text(entry.path());
  }
  return contents;
}

double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.detach().to(at::kDouble);
  const at::Tensor e = expected.detach().to(at::kDouble);
  return (a - e).norm().item<double>() / e.norm().item<double>();
}

int free_port() {
  const int socket = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(socket, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(socket, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(socket);
  return ntohs(address.sin_port);
}

}  // namespace mltrain::testing
