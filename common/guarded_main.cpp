#include "common/guarded_main.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "common/error.h"

namespace mltrain {
namespace {

// The first line of a message. mltrain's own are one line; LibTorch's errors append the C++
// stack of where they were raised, which helps its developers and buries the reason for users.
std::string_view first_line(std::string_view message) {
  return message.substr(0, message.find('\n'));
}

// A path mltrain may not write or read, or something in the way of one it writes, is the user's
// to fix, like any other bad input; other filesystem failures (a full disk, an I/O error) are
// runtime failures.
bool is_users_to_fix(const std::error_code& code) {
  return code == std::errc::permission_denied || code == std::errc::read_only_file_system ||
         code == std::errc::operation_not_permitted || code == std::errc::is_a_directory ||
         code == std::errc::not_a_directory || code == std::errc::too_many_symbolic_link_levels;
}

}  // namespace

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UserError& error) {
    spdlog::error("{}", error.what());
    return kExitUserError;
  } catch (const std::filesystem::filesystem_error& error) {
    spdlog::error("{}", first_line(error.what()));
    return is_users_to_fix(error.code()) ? kExitUserError : kExitRuntimeFailure;
  } catch (const std::exception& error) {
    spdlog::error("{}", first_line(error.what()));
    return kExitRuntimeFailure;
  }
}

}  // namespace mltrain
