#include "common/guarded_main.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "common/error.h"

namespace mltrain {

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UserError& error) {
    spdlog::error("{}", error.what());
    return kExitUserError;
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return kExitRuntimeFailure;
  }
}

}  // namespace mltrain
