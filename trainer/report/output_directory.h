#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

namespace mltrain {

// Makes `directory`, where a report writes what the config key `key` asks for (RUN_DIR/tensorboard
// for train.tensorboard, RUN_DIR/profile for train.profile_steps), before the first step: a file in
// its place, or a directory that cannot be made or written in, is a UserError naming the path, the
// key and what to do, instead of std::filesystem's text, or a report lost after the steps it cost.
// `contents` names what goes there, in messages ("TensorBoard's event files").
void make_output_directory(const std::filesystem::path& directory, std::string_view key,
                           std::string_view contents);

// What stands at `path`, in words for a message that says it is in the way ("a file", "a
// directory", "a symbolic link to nothing"); none where nothing is there.
std::optional<std::string_view> what_stands_at(const std::filesystem::path& path);

}  // namespace mltrain
