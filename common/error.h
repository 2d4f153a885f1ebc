#pragma once

#include <stdexcept>
#include <string>

namespace mltrain {

// Exit codes shared by every executable (ARCHITECTURE.md, "Errors and exit codes").
inline constexpr int kExitRuntimeFailure = 1;
inline constexpr int kExitUserError = 2;

// The one error type for bad user input: configs, files, shards, checkpoints, arguments. The
// message carries its context (which file, key or value, and what to do); main() logs it as one
// line and exits with kExitUserError. Anything else that escapes is a runtime failure.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace mltrain
