#include "trainer/run/hf_export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_tree.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "model/interop/hf_config.h"
#include "model/interop/hf_state_dict.h"
#include "model/layers/llama.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "trainer/checkpoint/checkpoint_store.h"
#include "trainer/run/run_data.h"

namespace mltrain {
namespace {

// "out/" names the directory out: the temporary beside it is then "out.tmp-PID".
std::filesystem::path without_trailing_separator(const std::filesystem::path& path) {
  const std::filesystem::path normal = std::filesystem::absolute(path).lexically_normal();
  return normal.has_filename() ? normal : normal.parent_path();
}

void refuse_existing(const std::filesystem::path& out_dir) {
  if (!std::filesystem::exists(out_dir)) return;
  const bool directory = std::filesystem::is_directory(out_dir);
  if (directory && std::filesystem::is_empty(out_dir)) return;
  throw UserError(
      fmt::format("--export-hf {}: already exists {}; give a new directory (nothing was written)",
                  out_dir.string(), directory ? "and is not empty" : "and is not a directory"));
}

// A checkpoint knows which model its weights are: the config.json written for them must be of
// that model, not of a config that merely has the same tensor shapes (another rope_theta, say).
void check_checkpoint_model(const std::filesystem::path& weights, const Config& config) {
  const std::filesystem::path checkpoint = weights.parent_path();
  if (!std::filesystem::exists(checkpoint / "state.json")) return;
  const std::filesystem::path saved = checkpoint / "config.yaml";
  std::vector<std::string> differences;
  for (const ModelKeyDifference& difference :
       model_differences(config.model, load_config(saved).model)) {
    differences.push_back(fmt::format("{}: {} in the config, {} in {}", difference.key,
                                      difference.ours, difference.theirs, saved.string()));
  }
  if (!differences.empty()) {
    throw UserError(fmt::format("{} holds another model than the config describes: {}",
                                checkpoint.string(), fmt::join(differences, "; ")));
  }
}

// SentencePiece reports a disabled special token as id -1.
std::optional<int64_t> special_token(uint32_t id, int64_t vocab_size) {
  if (static_cast<int64_t>(id) >= vocab_size) return std::nullopt;
  return id;
}

// Everything the directory holds, written into `directory`.
void write_export(const std::filesystem::path& directory, const Llama& model,
                  const HfConfig& hf_config, const Config& config, bool with_tokenizer,
                  const std::function<void(const std::filesystem::path&)>& after_weights) {
  save_model_weights(model, directory / "model.safetensors");
  if (after_weights) after_weights(directory);
  write_file_atomically(directory / "config.json", hf_config_json(hf_config));
  write_file_atomically(directory / "generation_config.json", hf_generation_config_json(hf_config));
  if (with_tokenizer) write_hf_tokenizer(config.data.tokenizer, directory);
  fsync_directory(directory);
}

}  // namespace

void export_hf(const Config& run_config, const std::filesystem::path& weights,
               const std::filesystem::path& out_dir,
               const std::function<void(const std::filesystem::path&)>& after_weights) {
  const std::filesystem::path target = without_trailing_separator(out_dir);
  refuse_existing(target);
  const std::filesystem::path file = find_weights(weights);
  Config config = run_config;
  config.data.tokenizer = tokenizer_for(file, run_config);
  check_checkpoint_model(file, config);
  check_tokenizer(config);
  check_weights_can_fill(config.model, "the config's model.* keys", file);
  // Only its weights are read; a LoRA run's adapters are merged into the weights they adapt.
  Llama model(config.model, Kernels::aten, LlamaImpl::Weights::drawn, c10::kCPU,
              checkpoint_lora(file, config));
  load_model_weights(model, file);
  model->merge_adapters();

  HfConfig hf_config{config.model, std::nullopt, std::nullopt};
  // check_tokenizer has refused a tokenizer that is set and missing, except the default path.
  const bool with_tokenizer =
      !config.data.tokenizer.empty() && std::filesystem::exists(config.data.tokenizer);
  if (with_tokenizer) {
    const Tokenizer tokenizer(config.data.tokenizer);
    // Documents are trained on as end-of-document, document, end-of-document: the end of one is
    // what the next starts from (mlgen puts it before a prompt), and SentencePiece's own
    // beginning-of-sentence token never occurs in a prepared corpus.
    hf_config.eos_token_id = special_token(tokenizer.end_of_document(), config.model.vocab_size);
    hf_config.bos_token_id = hf_config.eos_token_id;
  } else {
    spdlog::info(
        "the run has no tokenizer (data.tokenizer): exporting the model and its config only, "
        "without tokenizer files or special token ids");
  }

  const std::filesystem::path staging =
      target.parent_path() / fmt::format("{}.tmp-{}", target.filename().string(), getpid());
  std::error_code unwritable;
  remove_tree(staging, unwritable);  // left by an export of the same process id, killed
  std::filesystem::create_directories(target.parent_path(), unwritable);
  if (!unwritable) std::filesystem::create_directory(staging, unwritable);
  if (unwritable) {
    throw UserError(fmt::format("--export-hf {}: cannot write there ({}); nothing was written",
                                target.string(), unwritable.message()));
  }
  try {
    write_export(staging, model, hf_config, config, with_tokenizer, after_weights);
    // Over an empty directory too: rename replaces one, and refuses one that filled meanwhile,
    // which is the refusal of a non-empty OUT_DIR, only found later.
    std::error_code renamed;
    std::filesystem::rename(staging, target, renamed);
    if (renamed == std::errc::directory_not_empty || renamed == std::errc::file_exists) {
      throw UserError(
          fmt::format("--export-hf {}: it was filled while the export was written; "
                      "nothing was changed in it",
                      target.string()));
    }
    if (renamed)
      throw std::filesystem::filesystem_error("cannot publish the export", staging, target,
                                              renamed);
    fsync_directory(target.parent_path());
  } catch (...) {
    std::error_code ignored;
    remove_tree(staging, ignored);
    throw;
  }
  spdlog::info(
      "exported {} to {}: load it with transformers' "
      "AutoModelForCausalLM.from_pretrained(\"{}\")",
      file.string(), target.string(), target.string());
}

}  // namespace mltrain
