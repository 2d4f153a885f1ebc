#pragma once

#include <functional>

namespace mltrain {

// Runs an executable's body under the error policy: a UserError is logged as one line and exits
// kExitUserError; a filesystem error of permissions (a read-only directory) is the user's to fix
// too; any other exception is logged as its first line and exits kExitRuntimeFailure.
int guarded_main(const std::function<int()>& body);

}  // namespace mltrain
