#include "trainer/run/run_data.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/input_file.h"
#include "data/tokenizer.h"

namespace mltrain {

TokenWindows open_windows(const std::string& pattern, const Config& config, const char* split) {
  const auto start = std::chrono::steady_clock::now();
  TokenWindows windows(pattern, config.data.seq_len, config.model.vocab_size);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  spdlog::info("{} data: {} shards, {} tokens, {} windows of {} (validated in {:.1f} s)", split,
               windows.shards().size(), windows.num_tokens(), windows.num_windows(),
               windows.window_length(), took.count());
  return windows;
}

void check_tokenizer(const Config& config) {
  const std::string& path = config.data.tokenizer;
  if (path.empty()) return;
  if (path == DataConfig{}.tokenizer && !std::filesystem::exists(path)) {
    spdlog::info(
        "{}: no tokenizer there (the default data.tokenizer); training reads token shards and "
        "needs none, but mlgen will",
        path);
    return;
  }
  const Tokenizer tokenizer(path);
  if (tokenizer.vocab_size() > config.model.vocab_size) {
    throw UserError(fmt::format("{}: the tokenizer has {} tokens, more than model.vocab_size = {}",
                                path, tokenizer.vocab_size(), config.model.vocab_size));
  }
}

std::optional<int64_t> end_of_document_token(const Config& config) {
  if (config.data.eot_token >= 0) return config.data.eot_token;
  if (!std::filesystem::exists(config.data.tokenizer)) return std::nullopt;
  return Tokenizer(config.data.tokenizer).end_of_document();
}

std::optional<int64_t> document_start(const Config& config) {
  if (!config.data.document_masking) return std::nullopt;
  if (config.data.eot_token >= 0) return config.data.eot_token;
  // load_config has refused masking without either; check_tokenizer a tokenizer set and missing,
  // except at the default path.
  const std::string& path = config.data.tokenizer;
  if (!std::filesystem::exists(path)) {
    throw UserError(fmt::format(
        "data.document_masking needs the end-of-document token: there is no tokenizer at {} "
        "(data.tokenizer) to take it from; set data.eot_token to its id",
        path));
  }
  return Tokenizer(path).end_of_document();
}

namespace {

// The bytes of a tokenizer file; "" where there is none.
std::string tokenizer_bytes(const std::filesystem::path& path) {
  // SentencePiece models of the largest vocabularies are a few MB.
  constexpr uint64_t kMostTokenizerBytes = uint64_t{1} << 30;
  std::error_code missing;
  if (!std::filesystem::exists(path, missing)) return "";
  return InputFile(path, "tokenizer").read_all(kMostTokenizerBytes);
}

}  // namespace

std::string read_tokenizer_model(const Config& config) {
  return config.data.tokenizer.empty() ? "" : tokenizer_bytes(config.data.tokenizer);
}

namespace {

// Blended corpora must share their token ids: a tokenizer.model that mlprep left beside a
// source's training shards must be the run's (or, without one, the other sources').
void check_one_tokenizer(const Config& config) {
  std::filesystem::path reference = config.data.tokenizer;
  std::string expected = reference.empty() ? "" : tokenizer_bytes(reference);
  for (const DataSource& source : config.sources) {
    const std::filesystem::path beside =
        std::filesystem::path(source.train).parent_path() / "tokenizer.model";
    const std::string bytes = tokenizer_bytes(beside);
    if (bytes.empty()) continue;
    if (expected.empty()) {
      reference = beside;
      expected = bytes;
    } else if (bytes != expected) {
      throw UserError(fmt::format(
          "data.sources {}: its shards were made with another tokenizer ({} differs from {}): "
          "blended corpora must share token ids; prepare each with the same one (mlprep "
          "--tokenizer {})",
          source.name, beside.string(), reference.string(), reference.string()));
    }
  }
}

// Validation on shards that training reads too measures the fit to the training data, not the
// model: said, not refused (a smoke run may mean it).
void warn_of_shared_shards(const std::string& train, const std::string& val,
                           const std::string& what) {
  std::set<std::filesystem::path> training;
  for (const std::string& path : expand_glob(train))
    training.insert(std::filesystem::weakly_canonical(path));
  const std::vector<std::string> validation = expand_glob(val);
  const auto shared = std::count_if(validation.begin(), validation.end(), [&](const auto& path) {
    return training.contains(std::filesystem::weakly_canonical(path));
  });
  if (shared > 0) {
    spdlog::warn(
        "{}{} of the {} validation shards are training shards too ({} and {} share them): the "
        "validation loss is measured on data the run trains on",
        what, shared, validation.size(), train, val);
  }
}

TokenWindows open_source_windows(const std::string& pattern, const Config& config,
                                 const std::string& split, const std::string& name) {
  try {
    return open_windows(pattern, config, split.c_str());
  } catch (const UserError& error) {
    throw UserError(fmt::format("data.sources {}: {}", name, error.what()));
  }
}

}  // namespace

std::vector<RunSource> open_sources(const Config& config, bool train) {
  std::vector<RunSource> sources;
  if (config.sources.empty()) {
    std::optional<TokenWindows> train_windows;
    if (train) train_windows.emplace(open_windows(config.data.train, config, "train"));
    sources.push_back(
        {"", 1.0, std::move(train_windows), open_windows(config.data.val, config, "val")});
    if (train) warn_of_shared_shards(config.data.train, config.data.val, "");
    return sources;
  }
  // A config made for one corpus (configs/smoke.yaml) keeps its data.train and data.val when
  // data.sources is set over it: they are not read.
  const DataConfig defaults;
  if (config.data.train != defaults.train || config.data.val != defaults.val) {
    spdlog::info("data.sources is given: data.train ({}) and data.val ({}) are not read",
                 config.data.train, config.data.val);
  }
  check_one_tokenizer(config);
  for (const DataSource& source : config.sources) {
    std::optional<TokenWindows> train_windows;
    if (train)
      train_windows.emplace(open_source_windows(source.train, config,
                                                fmt::format("{} train", source.name), source.name));
    sources.push_back(
        {source.name, source.weight, std::move(train_windows),
         open_source_windows(source.val, config, fmt::format("{} val", source.name), source.name)});
    if (train)
      warn_of_shared_shards(source.train, source.val, "data.sources " + source.name + ": ");
  }
  return sources;
}

BlendedSampler blend_of(const std::vector<RunSource>& sources, const Config& config,
                        const BatchLayout& layout, BlendSegment segment) {
  std::vector<BlendSource> blend;
  for (const RunSource& source : sources) {
    blend.push_back({source.train->num_windows(), source.weight,
                     source_seed(static_cast<uint64_t>(config.data.seed), source.name)});
  }
  return BlendedSampler(std::move(blend), layout, std::move(segment));
}

namespace {

// The shares of `weights`: each over their sum.
std::vector<double> normalised(const std::vector<double>& weights) {
  double total = 0.0;
  for (const double weight : weights) total += weight;
  std::vector<double> shares;
  for (const double weight : weights) shares.push_back(total > 0 ? weight / total : 0.0);
  return shares;
}

}  // namespace

BlendResume resume_blend(const std::vector<RunSource>& sources, const TrainingProgress& progress,
                         const Config& config, const BatchLayout& layout) {
  BlendResume resume{{0, std::vector<int64_t>(sources.size(), 0)}, {}};
  if (progress.samples_consumed == 0) return resume;
  std::vector<SourceProgress> saved = progress.sources;
  if (saved.empty()) saved.push_back({"", 1.0, progress.samples_consumed, 0});
  const auto find = [&](const std::string& name) {
    return std::find_if(saved.begin(), saved.end(),
                        [&](const SourceProgress& entry) { return entry.name == name; });
  };
  std::vector<int64_t> consumed;
  std::vector<int64_t> at_start;
  std::vector<double> saved_weights;
  std::vector<double> weights;
  for (const RunSource& source : sources) {
    const auto entry = find(source.name);
    const bool found = entry != saved.end();
    consumed.push_back(found ? entry->consumed : 0);
    at_start.push_back(found ? entry->consumed_at_start : 0);
    saved_weights.push_back(found ? entry->weight : 0.0);
    weights.push_back(source.weight);
  }
  // The same blend: the listed sources in the checkpoint's order at its shares, and every source
  // it had that the config leaves out already unlisted there (weight 0).
  std::vector<std::string> order;
  for (const RunSource& source : sources) order.push_back(source.name);
  std::vector<std::string> saved_order;
  bool unlisted_were_paused = true;
  for (const SourceProgress& entry : saved) {
    if (std::find(order.begin(), order.end(), entry.name) != order.end()) {
      saved_order.push_back(entry.name);
    } else {
      unlisted_were_paused = unlisted_were_paused && entry.weight == 0;
    }
  }
  const bool same = saved_order == order && unlisted_were_paused &&
                    normalised(saved_weights) == normalised(weights);
  for (const SourceProgress& entry : saved) {
    if (std::find(order.begin(), order.end(), entry.name) == order.end())
      resume.unlisted.push_back(entry);
  }
  if (same) {
    resume.segment = {progress.blend_start, at_start};
    if (blend_of(sources, config, layout, resume.segment).consumed(progress.samples_consumed) ==
        consumed)
      return resume;
    spdlog::warn(
        "replaying the checkpoint's blend does not reach its counts of each source (another "
        "machine's floating point?): a new blend starts at sample {}, each source going on "
        "where it stopped",
        progress.samples_consumed);
  } else {
    spdlog::info(
        "the data sources or their weights differ from the checkpoint's: from sample {} on the "
        "blend takes the configured weights, each source going on where it stopped",
        progress.samples_consumed);
  }
  resume.segment = {progress.samples_consumed, consumed};
  for (SourceProgress& entry : resume.unlisted) {
    entry.weight = 0;
    entry.consumed_at_start = entry.consumed;
  }
  return resume;
}

std::vector<double> shares_of(const std::vector<RunSource>& sources) {
  std::vector<double> weights;
  for (const RunSource& source : sources) weights.push_back(source.weight);
  return normalised(weights);
}

void check_batch_fits(const BatchLayout& layout, const std::vector<RunSource>& sources) {
  int64_t windows = 0;
  for (const RunSource& source : sources) windows += source.train->num_windows();
  // Counted in double: with enough ranks the product can pass what 64 bits hold.
  const double global_batch = static_cast<double>(layout.micro_batch) *
                              static_cast<double>(layout.grad_accum) *
                              static_cast<double>(layout.world_size);
  if (global_batch <= static_cast<double>(windows)) return;
  throw UserError(
      fmt::format("a global batch of {} windows (data.micro_batch {} x data.grad_accum {} x {} "
                  "ranks) is more than the {} windows of the training data: lower "
                  "data.micro_batch or data.grad_accum, or add data",
                  global_batch, layout.micro_batch, layout.grad_accum, layout.world_size, windows));
}

}  // namespace mltrain
