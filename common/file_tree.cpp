#include "common/file_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <string>

namespace mltrain {
namespace {

// Called for each entry after its children (FTW_DEPTH): by then a directory is empty.
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}

// Open directory handles at once while walking: more only makes deep trees slightly faster.
constexpr int kOpenDirectories = 16;

}  // namespace

void remove_tree(const std::filesystem::path& path, std::error_code& error) noexcept {
  error.clear();
  const int result = ::nftw(path.c_str(), remove_entry, kOpenDirectories, FTW_DEPTH | FTW_PHYS);
  if (result == 0) return;
  // nftw returns remove_entry's errno, or -1 with errno set when it cannot walk: ENOENT when the
  // path is not there, or went away while it walked.
  const int code = result > 0 ? result : errno;
  struct stat status {};
  if (code == ENOENT && ::lstat(path.c_str(), &status) != 0 && errno == ENOENT) return;
  error.assign(code, std::generic_category());
}

void remove_tree(const std::filesystem::path& path) {
  std::error_code error;
  remove_tree(path, error);
  if (error) throw std::filesystem::filesystem_error("cannot remove", path, error);
}

std::optional<std::filesystem::path> move_aside(const std::filesystem::path& path,
                                                const std::string& label) {
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, error))) return std::nullopt;
  for (int n = 1;; ++n) {
    std::filesystem::path aside = path;
    aside += "." + label + "-" + std::to_string(n);
    if (std::filesystem::exists(std::filesystem::symlink_status(aside, error))) continue;
    std::filesystem::rename(path, aside);
    return aside;
  }
}

}  // namespace mltrain
