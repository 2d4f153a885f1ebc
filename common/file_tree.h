#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace mltrain {

// Removes `path` and, if it is a directory, everything below it, as std::filesystem::remove_all
// does: symbolic links are removed, never followed, and a path that does not exist is no error.
//
// Why not remove_all itself: the torch wheel's libtorch.so exports its own copy of it, which
// calls a libstdc++ function through a weak reference that is null where the system's libstdc++
// lacks it. Where the dynamic linker binds a call to that copy (seen on an Ubuntu GPU machine),
// removing a directory segfaults. This walks the tree with POSIX nftw, which no library shadows.
void remove_tree(const std::filesystem::path& path);  // throws std::filesystem::filesystem_error
void remove_tree(const std::filesystem::path& path, std::error_code& error) noexcept;

// Renames what is at `path` (a file, a directory, a link) to the first free PATH.LABEL-N
// (PATH.replaced-1, ...) and returns that name, for a writer that must not delete what holds the
// name it writes to, or what must no longer be found under its name; none where nothing is there.
std::optional<std::filesystem::path> move_aside(
    const std::filesystem::path& path,
    const std::string& label = "replaced");  // throws filesystem_error

}  // namespace mltrain
