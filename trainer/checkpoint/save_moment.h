#pragma once

#include <filesystem>
#include <functional>

namespace mltrain {

// The moments of a checkpoint save at which the tests make it fail or the process die
// (TrainingHooks): each is a different state of the run directory for a crash to leave behind.
enum class SaveMoment {
  share_written,    // a rank's share of the tensor files is in step_X.tmp/ (on every rank)
  weights_written,  // the tensor files are complete in step_X.tmp/, the others are not (rank 0)
  files_written,    // every file is complete in step_X.tmp/
  renamed,          // step_X/ has its final name, and `latest` still names the checkpoint before
};

// Called at each SaveMoment with the checkpoint's directory as it is named at that moment.
using SaveObserver = std::function<void(SaveMoment, const std::filesystem::path& directory)>;

}  // namespace mltrain
