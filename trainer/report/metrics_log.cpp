#include "trainer/report/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <system_error>

#include "common/error.h"
#include "common/json_text.h"

namespace mltrain {
namespace {

[[noreturn]] void fail(const char* what, const std::filesystem::path& path, int error) {
  throw std::filesystem::filesystem_error(what, path,
                                          std::error_code(error, std::generic_category()));
}

}  // namespace

MetricsLog::MetricsLog(const std::filesystem::path& path) : path_(path) {
  // O_NONBLOCK: a named pipe in its place is refused at once rather than waited on.
  fd_ = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open the metrics file", path_, errno);
  struct stat status {};
  if (::fstat(fd_, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd_);
    throw UserError(fmt::format("{}: not a regular file; move it away", path_.string()));
  }
  char last = '\n';
  if (status.st_size > 0 && ::pread(fd_, &last, 1, status.st_size - 1) == 1 && last != '\n')
    append("\n");
}

MetricsLog::~MetricsLog() { ::close(fd_); }

void MetricsLog::write(const nlohmann::json& record) { append(json_text(record) + "\n"); }

void MetricsLog::append(const std::string& text) {
  const ssize_t written = ::write(fd_, text.data(), text.size());
  if (written != static_cast<ssize_t>(text.size()))
    fail("cannot write the metrics file", path_, written < 0 ? errno : ENOSPC);
}

}  // namespace mltrain
