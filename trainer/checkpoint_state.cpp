#include "trainer/checkpoint_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/error.h"
#include "common/input_file.h"

namespace mltrain {
namespace {

using Json = nlohmann::json;

constexpr int kStateFormat = 1;

// Counts are kept to the integers that every JSON reader holds exactly; a step a millisecond for
// 285,000 years stays below.
constexpr int64_t kMostCount = int64_t{1} << 53;
// As the dry run's --ranks.
constexpr int64_t kMostRanks = int64_t{1} << 20;

const std::regex kCheckpointName(R"(step_(\d{8,18}))");

std::string hex(const std::vector<uint8_t>& bytes) {
  std::string text;
  text.reserve(2 * bytes.size());
  for (const uint8_t byte : bytes) text += fmt::format("{:02x}", byte);
  return text;
}

// One key of state.json, read with its checks; every failure names the file and the key.
class StateReader {
 public:
  StateReader(const Json& json, std::filesystem::path path) : json_(json), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(fmt::format("{}: \"{}\" {}", path_.string(), key, what));
  }

  const Json& at(const std::string& key) const {
    const auto found = json_.find(key);
    if (found == json_.end()) fail(key, "is missing");
    return *found;
  }

  int64_t integer(const std::string& key, int64_t min, int64_t max) const {
    const Json& value = at(key);
    const bool in_range = value.is_number_integer() && value.get<int64_t>() >= min &&
                          value.get<int64_t>() <= max &&
                          !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(max));
    if (!in_range)
      fail(key, fmt::format("must be an integer from {} to {}, got {}", min, max, value.dump()));
    return value.get<int64_t>();
  }

  // A finite number of at least 0; `nullable`: or null, read as infinity (no value yet).
  double non_negative(const std::string& key, bool nullable) const {
    const Json& value = at(key);
    if (nullable && value.is_null()) return std::numeric_limits<double>::infinity();
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0)
      fail(key, fmt::format("must be a number of at least 0{}, got {}", nullable ? " or null" : "",
                            value.dump()));
    return value.get<double>();
  }

  // A string of hexadecimal digits, two to a byte.
  std::vector<uint8_t> hex_bytes(const Json& value, const std::string& key) const {
    static const std::regex kHex("([0-9a-f]{2})*");
    if (!value.is_string() || !std::regex_match(value.get_ref<const std::string&>(), kHex))
      fail(key, "must be a string of lowercase hexadecimal digits, two to a byte");
    const std::string& text = value.get_ref<const std::string&>();
    std::vector<uint8_t> bytes(text.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
    return bytes;
  }

 private:
  const Json& json_;
  std::filesystem::path path_;
};

TrainingProgress read_progress(const StateReader& state) {
  TrainingProgress progress;
  progress.step = state.integer("step", 1, kMostCount);
  // Every step consumes at least one sample, and every sample at least one token.
  progress.samples_consumed = state.integer("samples_consumed", progress.step, kMostCount);
  progress.tokens_seen = state.integer("tokens_seen", progress.samples_consumed, kMostCount);
  progress.learning_rate = state.non_negative("learning_rate", false);
  progress.best_val_loss = state.non_negative("best_val_loss", true);
  return progress;
}

std::map<std::string, std::string> read_checksums(const StateReader& state) {
  const std::string key = "checksums_xxh3";
  const Json& json = state.at(key);
  if (!json.is_object()) state.fail(key, "must be an object of file names and checksums");
  static const std::regex kChecksum("[0-9a-f]{16}");
  std::map<std::string, std::string> checksums;
  for (const std::string& name : checkpoint_files()) {
    const auto found = json.find(name);
    if (found == json.end()) state.fail(key, fmt::format("has no checksum for {}", name));
    if (!found->is_string() || !std::regex_match(found->get_ref<const std::string&>(), kChecksum))
      state.fail(key + "." + name, "must be 16 lowercase hexadecimal digits");
    checksums[name] = found->get<std::string>();
  }
  // The names are the checkpoint's own files: a listed path could send the check elsewhere.
  if (json.size() != checksums.size())
    state.fail(key,
               fmt::format("lists files that are not a checkpoint's (only {}, {} and {})",
                           checkpoint_files()[0], checkpoint_files()[1], checkpoint_files()[2]));
  return checksums;
}

}  // namespace

std::string checkpoint_state_json(const CheckpointState& state) {
  const TrainingProgress& progress = state.progress;
  const Json json = {
      {"format", kStateFormat},
      {"step", progress.step},
      {"samples_consumed", progress.samples_consumed},
      {"tokens_seen", progress.tokens_seen},
      {"learning_rate", progress.learning_rate},
      {"best_val_loss",
       std::isfinite(progress.best_val_loss) ? Json(progress.best_val_loss) : Json()},
      {"world_size", state.world_size},
      {"rng", {{"cpu", hex(state.cpu_rng)}}},
      {"checksums_xxh3", state.checksums},
      {"versions", {{"mltrain", MLTRAIN_VERSION}, {"torch", TORCH_VERSION}}},
  };
  return json.dump(2) + "\n";
}

CheckpointState read_checkpoint_state(const std::filesystem::path& checkpoint) {
  const std::filesystem::path path = checkpoint / "state.json";
  if (!std::filesystem::exists(path))
    throw UserError(fmt::format("{}: not a checkpoint (no state.json)", checkpoint.string()));
  Json json;
  try {
    json = Json::parse(read_text_file(path, "checkpoint state"));
  } catch (const Json::exception& error) {
    throw UserError(fmt::format("{}: damaged checkpoint state ({})", path.string(), error.what()));
  }
  if (!json.is_object())
    throw UserError(fmt::format("{}: damaged checkpoint state (not a JSON object)", path.string()));
  const StateReader reader(json, path);
  reader.integer("format", kStateFormat, kStateFormat);

  CheckpointState state;
  state.progress = read_progress(reader);
  std::smatch name;
  const std::string directory = checkpoint.filename().string();
  if (std::regex_match(directory, name, kCheckpointName) &&
      std::stoll(name[1]) != state.progress.step) {
    reader.fail("step", fmt::format("is {}, but the checkpoint directory is {}",
                                    state.progress.step, directory));
  }
  state.world_size = reader.integer("world_size", 1, kMostRanks);

  const Json& rng = reader.at("rng");
  if (!rng.is_object() || !rng.contains("cpu"))
    reader.fail("rng", "must be an object with \"cpu\"");
  state.cpu_rng = reader.hex_bytes(rng["cpu"], "rng.cpu");
  const auto expected =
      static_cast<size_t>(at::detail::getDefaultCPUGenerator().get_state().numel());
  if (state.cpu_rng.size() != expected) {
    reader.fail("rng.cpu", fmt::format("holds {} bytes; this LibTorch's CPU generator state has {}",
                                       state.cpu_rng.size(), expected));
  }
  state.checksums = read_checksums(reader);
  return state;
}

}  // namespace mltrain
