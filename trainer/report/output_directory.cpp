#include "trainer/report/output_directory.h"

#include <fmt/format.h>

#include <string>
#include <system_error>

#include "common/atomic_file.h"
#include "common/error.h"

namespace mltrain {

std::optional<std::string_view> what_stands_at(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, error))) return std::nullopt;
  switch (std::filesystem::status(path, error).type()) {
    case std::filesystem::file_type::directory:
      return "a directory";
    case std::filesystem::file_type::regular:
      return "a file";
    case std::filesystem::file_type::fifo:
      return "a named pipe";
    case std::filesystem::file_type::socket:
      return "a socket";
    case std::filesystem::file_type::block:
    case std::filesystem::file_type::character:
      return "a device";
    default:  // a link that leads nowhere, or round in a loop
      return "a symbolic link to nothing";
  }
}

void make_output_directory(const std::filesystem::path& directory, std::string_view key,
                           std::string_view contents) {
  std::error_code error;
  if (!std::filesystem::is_directory(std::filesystem::status(directory, error))) {
    if (const std::optional<std::string_view> there = what_stands_at(directory)) {
      throw UserError(fmt::format("{}: {} is {}, where {} go: move it away, or turn {} off", key,
                                  directory.string(), *there, contents, key));
    }
  }
  std::filesystem::create_directories(directory, error);
  // Root writes in a read-only directory: only making a file says whether this process can.
  const std::optional<std::string> reason =
      error ? std::optional<std::string>(error.message()) : unwritable_reason(directory);
  if (reason) {
    throw UserError(fmt::format(
        "{}: cannot write {} in {} ({}): give the run a train.run_dir it may write, or turn {} off",
        key, contents, directory.string(), *reason, key));
  }
}

}  // namespace mltrain
