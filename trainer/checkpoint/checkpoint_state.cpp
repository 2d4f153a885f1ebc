#include "trainer/checkpoint/checkpoint_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/input_file.h"
#include "common/json_text.h"
#include "dist/world.h"
#include "trainer/checkpoint/checkpoint_format.h"

namespace mltrain {
namespace {

using Json = nlohmann::json;

// Format 2 may list the checkpoint's tokenizer among its files; format 1, which never does, is
// read too. An older mltrain refuses format 2 by its number.
constexpr int kOldestStateFormat = 1;
constexpr int kStateFormat = 2;

// Counts are kept to the integers that every JSON reader holds exactly; a step a millisecond for
// 285,000 years stays below.
constexpr int64_t kMostCount = int64_t{1} << 53;

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

  bool has(const std::string& key) const { return json_.contains(key); }
  const std::filesystem::path& path() const { return path_; }

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
      fail(key, fmt::format("must be an integer from {} to {}, got {}", min, max,
                            json_value_text(value)));
    return value.get<int64_t>();
  }

  // A finite number of at least 0; `nullable`: or null, read as infinity (no value yet).
  double non_negative(const std::string& key, bool nullable) const {
    const Json& value = at(key);
    if (nullable && value.is_null()) return std::numeric_limits<double>::infinity();
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0)
      fail(key, fmt::format("must be a number of at least 0{}, got {}", nullable ? " or null" : "",
                            json_value_text(value)));
    return value.get<double>();
  }

  // A string of lowercase hexadecimal digits, two to a byte, of `size` bytes. Checked with a loop:
  // a regular expression would recurse once a digit pair in libstdc++, and a long string would
  // overflow the stack.
  std::vector<uint8_t> hex_bytes(const Json& value, const std::string& key, size_t size) const {
    const auto digit = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
    if (!value.is_string() || !std::all_of(value.get_ref<const std::string&>().begin(),
                                           value.get_ref<const std::string&>().end(), digit))
      fail(key, "must be a string of lowercase hexadecimal digits");
    const std::string& text = value.get_ref<const std::string&>();
    if (text.size() != 2 * size)
      fail(key, fmt::format("holds {} digits where {} bytes take {}", text.size(), size, 2 * size));
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i < size; ++i)
      bytes[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
    return bytes;
  }

 private:
  const Json& json_;
  std::filesystem::path path_;
};

// "blend": {"start", "sources": [{"name", "weight", "consumed", "consumed_at_start"}]}: every
// sample is some source's, so the counts add up to the samples consumed and, before the start, to
// the start; no name is given twice.
void read_blend(const StateReader& state, TrainingProgress& progress) {
  const Json& blend = state.at("blend");
  if (!blend.is_object() || !blend.contains("sources") || !blend["sources"].is_array() ||
      blend["sources"].empty())
    state.fail("blend", "must be an object with \"start\" and a list of \"sources\"");
  const std::string file = state.path().string();
  const StateReader reader(blend, file + ": blend");
  progress.blend_start = reader.integer("start", 0, progress.samples_consumed);
  int64_t consumed = 0;
  int64_t at_start = 0;
  std::set<std::string> names;
  for (size_t i = 0; i < blend["sources"].size(); ++i) {
    const Json& entry = blend["sources"][i];
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string())
      state.fail("blend", fmt::format("source {} is not an object with a \"name\"", i + 1));
    const StateReader source(entry, fmt::format("{}: blend source {}", file, i + 1));
    SourceProgress read;
    read.name = entry["name"].get<std::string>();
    if (!names.insert(read.name).second)
      state.fail("blend", fmt::format("names the source \"{}\" twice", read.name));
    read.weight = source.non_negative("weight", false);
    read.consumed = source.integer("consumed", 0, progress.samples_consumed);
    read.consumed_at_start = source.integer("consumed_at_start", 0, read.consumed);
    consumed += read.consumed;
    at_start += read.consumed_at_start;
    progress.sources.push_back(std::move(read));
  }
  if (consumed != progress.samples_consumed || at_start != progress.blend_start) {
    state.fail("blend",
               fmt::format("counts {} samples and {} before its start, where the "
                           "checkpoint consumed {} and the blend started at {}",
                           consumed, at_start, progress.samples_consumed, progress.blend_start));
  }
}

TrainingProgress read_progress(const StateReader& state) {
  TrainingProgress progress;
  progress.step = state.integer("step", 1, kMostCount);
  // Every step consumes at least one sample, and every sample at least one token.
  progress.samples_consumed = state.integer("samples_consumed", progress.step, kMostCount);
  progress.tokens_seen = state.integer("tokens_seen", progress.samples_consumed, kMostCount);
  progress.learning_rate = state.non_negative("learning_rate", false);
  progress.best_val_loss = state.non_negative("best_val_loss", true);
  // Checkpoints from before the spike guard have none: its level starts again.
  if (state.has("loss_level")) progress.loss_level = state.non_negative("loss_level", false);
  if (state.has("blend")) read_blend(state, progress);
  return progress;
}

std::map<std::string, std::string> read_checksums(const StateReader& state) {
  const std::string key = "checksums_xxh3";
  const Json& json = state.at(key);
  if (!json.is_object()) state.fail(key, "must be an object of file names and checksums");
  std::map<std::string, std::string> checksums;
  for (const std::string& name : checkpoint_files()) {
    const auto found = json.find(name);
    if (found == json.end()) state.fail(key, fmt::format("has no checksum for {}", name));
    state.hex_bytes(*found, fmt::format("{}.{}", key, name), 8);  // XXH3's 64 bits
    checksums[name] = found->get<std::string>();
  }
  const std::string tokenizer(kCheckpointTokenizer);
  if (const auto found = json.find(tokenizer); found != json.end()) {
    state.hex_bytes(*found, fmt::format("{}.{}", key, tokenizer), 8);
    checksums[tokenizer] = found->get<std::string>();
  }
  // The names are the checkpoint's own files: a listed path could send the check elsewhere.
  if (json.size() != checksums.size())
    state.fail(key, fmt::format("lists files that are not a checkpoint's (only {}, {}, {} and {})",
                                checkpoint_files()[0], checkpoint_files()[1], checkpoint_files()[2],
                                tokenizer));
  return checksums;
}

}  // namespace

std::string checkpoint_state_json(const CheckpointState& state) {
  const TrainingProgress& progress = state.progress;
  Json json = {
      {"format", kStateFormat},
      {"step", progress.step},
      {"samples_consumed", progress.samples_consumed},
      {"tokens_seen", progress.tokens_seen},
      {"learning_rate", progress.learning_rate},
      {"best_val_loss",
       std::isfinite(progress.best_val_loss) ? Json(progress.best_val_loss) : Json()},
      {"loss_level", progress.loss_level},
      {"world_size", state.world_size},
      {"rng", {{"cpu", hex(state.cpu_rng)}}},
      {"checksums_xxh3", state.checksums},
      {"versions", {{"mltrain", MLTRAIN_VERSION}, {"torch", TORCH_VERSION}}},
  };
  if (!progress.sources.empty()) {
    Json sources = Json::array();
    for (const SourceProgress& source : progress.sources) {
      sources.push_back({{"name", source.name},
                         {"weight", source.weight},
                         {"consumed", source.consumed},
                         {"consumed_at_start", source.consumed_at_start}});
    }
    json["blend"] = {{"start", progress.blend_start}, {"sources", std::move(sources)}};
  }
  return json_text(json, 2) + "\n";
}

CheckpointState read_checkpoint_state(const std::filesystem::path& checkpoint) {
  const std::filesystem::path path = checkpoint / "state.json";
  if (!std::filesystem::exists(path)) {
    const bool weights_only = std::filesystem::exists(checkpoint / "model.safetensors");
    throw UserError(fmt::format(
        "{}: not a checkpoint (no state.json){}", checkpoint.string(),
        weights_only ? ": weights alone (a Hugging Face export?) start a new run through "
                       "model.init_from, not --resume"
                     : ""));
  }
  Json json;
  try {
    json = Json::parse(read_text_file(path, "checkpoint state"));
  } catch (const Json::exception& error) {
    throw UserError(fmt::format("{}: damaged checkpoint state ({})", path.string(), error.what()));
  }
  if (!json.is_object())
    throw UserError(fmt::format("{}: damaged checkpoint state (not a JSON object)", path.string()));
  const StateReader reader(json, path);
  reader.integer("format", kOldestStateFormat, kStateFormat);

  CheckpointState state;
  state.progress = read_progress(reader);
  const std::string directory = checkpoint.filename().string();
  if (const auto named = checkpoint_step(directory); named && *named != state.progress.step) {
    reader.fail("step", fmt::format("is {}, but the checkpoint directory is {}",
                                    state.progress.step, directory));
  }
  state.world_size = reader.integer("world_size", 1, kMostRanks);

  const Json& rng = reader.at("rng");
  if (!rng.is_object() || !rng.contains("cpu"))
    reader.fail("rng", "must be an object with \"cpu\"");
  // As many bytes as this LibTorch's CPU generator keeps.
  state.cpu_rng = reader.hex_bytes(
      rng["cpu"], "rng.cpu",
      static_cast<size_t>(at::detail::getDefaultCPUGenerator().get_state().numel()));
  state.checksums = read_checksums(reader);
  return state;
}

}  // namespace mltrain
