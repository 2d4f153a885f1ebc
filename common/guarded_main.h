#pragma once

#include <functional>

namespace mltrain {

// Runs an executable's body under the error policy: a UserError is logged as one line and exits
// kExitUserError, any other exception is logged and exits kExitRuntimeFailure.
int guarded_main(const std::function<int()>& body);

}  // namespace mltrain
