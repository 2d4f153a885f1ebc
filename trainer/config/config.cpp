#include "trainer/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"
#include "common/type_name.h"
#include "common/utf8_text.h"
#include "trainer/config/data_sources.h"

namespace mltrain {
namespace {

// Where a value came from, for error messages: "configs/base.yaml:7" or "--set model.d_model=...".
using Origin = std::string;

// One documented key: how to read it into a Config and how to show its value.
struct KeySpec {
  std::string path;  // "section.key"
  std::string description;
  std::function<void(Config&, const YAML::Node&, const Origin&)> read;
  std::function<std::string(const Config&)> show;
  bool quoted = false;  // strings are written quoted so any text survives the round trip
  // How the YAML writes a value that is not one scalar (data.sources); none: show()'s text.
  std::function<void(YAML::Emitter&, const Config&)> emit;
};

// data.sources, a list (config/data_sources.h).
KeySpec data_sources_key() {
  KeySpec spec;
  spec.path = "data.sources";
  spec.description =
      "corpora to blend, a list of {name, train, val, weight}: each source's share of the "
      "training samples is its weight over the sum, and validation reports each (empty: the one "
      "corpus of data.train and data.val)";
  spec.read = [](Config& config, const YAML::Node& node, const Origin& origin) {
    config.sources = read_data_sources(node, origin);
  };
  spec.show = [](const Config& config) { return show_data_sources(config.sources); };
  spec.emit = [](YAML::Emitter& out, const Config& config) {
    emit_data_sources(out, config.sources);
  };
  return spec;
}

// The limits a value must respect; each key sets the ones that apply.
// Every number must be finite besides.
struct Limits {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool below_max = false;  // max itself is out
  std::vector<std::string> choices;
};

constexpr double kInfinity = std::numeric_limits<double>::infinity();
Limits at_least(double min) { return Limits{min, kInfinity, false, {}}; }
Limits between(double min, double max) { return Limits{min, max, false, {}}; }
Limits at_least_and_below(double min, double max) { return Limits{min, max, true, {}}; }
Limits one_of(std::vector<std::string> choices) {
  return Limits{-kInfinity, kInfinity, false, std::move(choices)};
}

// The range a number must be in, for the message.
std::string range_of(const Limits& limits) {
  if (limits.max == kInfinity) return fmt::format("at least {}", limits.min);
  if (limits.below_max) return fmt::format("at least {} and below {}", limits.min, limits.max);
  return fmt::format("between {} and {}", limits.min, limits.max);
}

template <class T>
void check_limits(const T& value, const Limits& limits, const std::string& path,
                  const Origin& origin) {
  if constexpr (std::is_same_v<T, std::string>) {
    require_utf8(value, fmt::format("{}: {}", origin, path));
    if (!limits.choices.empty() &&
        std::find(limits.choices.begin(), limits.choices.end(), value) == limits.choices.end()) {
      throw UserError(fmt::format("{}: {} must be one of {}, got \"{}\"", origin, path,
                                  fmt::join(limits.choices, ", "), value));
    }
  } else if constexpr (!std::is_same_v<T, bool>) {
    const double number = static_cast<double>(value);
    if (!std::isfinite(number)) {
      throw UserError(fmt::format("{}: {} must be a finite number, got {}", origin, path, value));
    }
    const bool above = limits.below_max ? !(number < limits.max) : !(number <= limits.max);
    if (!(number >= limits.min) || above) {
      throw UserError(
          fmt::format("{}: {} must be {}, got {}", origin, path, range_of(limits), value));
    }
  }
}

// What a value that does not fit is, for the message: its text, or what kind of YAML it is.
std::string describe(const YAML::Node& node) {
  if (node.IsScalar()) return "\"" + node.Scalar() + "\"";
  if (node.IsNull()) return "an empty value";
  return node.IsMap() ? "a YAML mapping" : "a YAML sequence";
}

// A key whose value `access(config)` is, for a mutable Config and a const one alike.
template <class T, class Access>
KeySpec make_key(Access access, std::string path, std::string description, Limits limits) {
  KeySpec spec;
  spec.path = path;
  spec.description = std::move(description);
  spec.quoted = std::is_same_v<T, std::string>;
  spec.read = [access, path, limits](Config& config, const YAML::Node& node, const Origin& origin) {
    T value{};
    // YAML reads an empty value (`--set data.tokenizer=`, `tokenizer:`) as null; for a string that
    // is the empty string, which a key such as data.tokenizer takes to mean "none".
    bool converted = node.IsScalar() || (std::is_same_v<T, std::string> && node.IsNull());
    if (converted && node.IsScalar()) {
      try {
        value = node.as<T>();
      } catch (const YAML::Exception&) {
        converted = false;
      }
    }
    if (!converted) {
      throw UserError(
          fmt::format("{}: {} expects {}, got {}", origin, path, type_name<T>(), describe(node)));
    }
    check_limits(value, limits, path, origin);
    access(config) = value;
  };
  spec.show = [access](const Config& config) { return fmt::format("{}", access(config)); };
  return spec;
}

template <class Section, class T>
KeySpec key(Section Config::*section, T Section::*field, std::string path, std::string description,
            Limits limits = {}) {
  const auto access = [=](auto& c) -> auto& { return c.*section.*field; };
  return make_key<T>(access, std::move(path), std::move(description), std::move(limits));
}

// A key that Config holds itself, outside the struct of its section.
template <class T>
KeySpec key(T Config::*field, std::string path, std::string description, Limits limits = {}) {
  const auto access = [field](auto& c) -> auto& { return c.*field; };
  return make_key<T>(access, std::move(path), std::move(description), std::move(limits));
}

// A KeySpec of a key list's entry (config.h, model/layers/model_config.h), in section `section`.
#define MLTRAIN_KEY_SPEC(section, type, name, default_value, doc, check) \
  key(&Config::section, &decltype(Config::section)::name, #section "." #name, doc, check),

// Every key, in the order the YAML and the reference table show them.
const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      MLTRAIN_MODEL_KEYS(MLTRAIN_KEY_SPEC, model)  //
      key(&Config::init_from, "model.init_from",
          "Hugging Face LLaMA directory whose weights a fresh run starts from; its config.json "
          "must match the model.* keys (empty: seeded initial weights)"),
      MLTRAIN_DATA_KEYS(MLTRAIN_KEY_SPEC, data)  //
      data_sources_key(),
      MLTRAIN_OPTIM_KEYS(MLTRAIN_KEY_SPEC, optim)  //
      MLTRAIN_TRAIN_KEYS(MLTRAIN_KEY_SPEC, train)  //
      MLTRAIN_DIST_KEYS(MLTRAIN_KEY_SPEC, dist)    //
      MLTRAIN_LORA_KEYS(MLTRAIN_KEY_SPEC, lora)    //
  };
  return specs;
}

#undef MLTRAIN_KEY_SPEC

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
    }
  }
  return row[b.size()];
}

// The names other trainers (nanoGPT, llm.c, Hugging Face, Megatron, DeepSpeed, torchtitan, PyTorch
// DDP) give to what mltrain calls `path`. Users bring them along, and their spelling is often far
// from ours (learning_rate is nearer optim.min_lr than optim.lr), so they are known by name.
struct KeyAliases {
  std::string_view path;
  std::vector<std::string_view> names;
};

const std::vector<KeyAliases>& key_aliases() {
  static const std::vector<KeyAliases> aliases = {
      {"model.vocab_size", {"padded_vocab_size", "n_vocab"}},
      {"model.d_model", {"n_embd", "n_embed", "hidden_size", "dim", "embed_dim"}},
      {"model.n_layers", {"n_layer", "num_layers", "num_hidden_layers"}},
      {"model.n_q_heads", {"n_head", "n_heads", "num_heads", "num_attention_heads"}},
      {"model.n_kv_heads",
       {"n_kv_head", "num_kv_heads", "num_key_value_heads", "num_query_groups"}},
      {"model.d_ffn", {"intermediate_size", "ffn_hidden_size", "ffn_dim", "d_ff", "n_inner"}},
      {"model.max_seq_len", {"max_position_embeddings", "n_positions", "n_ctx"}},
      {"model.rope_theta", {"rope_base", "rotary_base"}},
      {"model.norm_eps", {"rms_norm_eps", "layer_norm_eps", "layernorm_epsilon", "norm_epsilon"}},
      {"model.tie_word_embeddings", {"tie_embeddings", "weight_tying"}},
      {"model.init_std", {"initializer_range"}},
      {"model.init_from", {"model_name_or_path", "pretrained_model_name_or_path"}},
      {"data.train", {"input_bin", "train_data"}},
      {"data.val", {"input_val_bin", "val_data"}},
      {"data.tokenizer", {"tokenizer_path"}},
      {"data.seq_len",
       {"block_size", "context_length", "seq_length", "sequence_length", "max_seq_length"}},
      {"data.micro_batch",
       {"batch_size", "micro_batch_size", "local_batch_size", "per_device_train_batch_size",
        "train_micro_batch_size_per_gpu"}},
      {"data.grad_accum",
       {"gradient_accumulation_steps", "grad_accum_steps", "accumulate_grad_batches"}},
      {"data.seed", {"random_seed"}},
      {"optim.lr", {"learning_rate", "max_lr", "peak_lr"}},
      {"optim.min_lr", {"min_learning_rate", "lr_min", "final_lr"}},
      {"optim.warmup_steps", {"warmup_iters", "num_warmup_steps", "lr_warmup_steps", "warmup"}},
      {"optim.schedule",
       {"lr_scheduler_type", "lr_scheduler", "lr_schedule", "scheduler", "decay_lr"}},
      {"optim.beta1", {"adam_beta1"}},
      {"optim.beta2", {"adam_beta2"}},
      {"optim.eps", {"adam_epsilon", "adam_eps"}},
      {"optim.grad_clip",
       {"max_grad_norm", "grad_norm_clip", "clip_grad_norm", "gradient_clipping", "clip_grad",
        "max_norm"}},
      // The schedule decays until the last step: nanoGPT's lr_decay_iters is mltrain's run length.
      {"train.max_steps",
       {"max_iters", "num_iterations", "train_iters", "num_train_steps", "total_steps", "num_steps",
        "steps", "lr_decay_iters"}},
      {"train.precision", {"dtype", "mixed_precision", "mixed_precision_param", "bf16"}},
      {"train.run_dir", {"out_dir", "output_dir", "dump_folder", "save_dir"}},
      {"train.log_every", {"log_interval", "logging_steps", "log_freq"}},
      {"train.eval_every", {"eval_interval", "eval_steps", "val_loss_every", "eval_freq"}},
      {"train.eval_batches", {"eval_iters", "val_max_steps"}},
      {"train.ckpt_every", {"save_steps", "save_interval", "checkpoint_interval", "ckpt_interval"}},
      {"train.keep_last", {"save_total_limit", "keep_latest_k"}},
      {"dist.backend", {"ddp_backend"}},
      {"dist.bucket_mb", {"bucket_cap_mb", "ddp_bucket_cap_mb"}},
      {"dist.zero_stage", {"zero_optimization"}},
      {"dist.shard_ranks", {"data_parallel_shard_degree", "sharding_group_size"}},
      {"train.activation_checkpointing",
       {"gradient_checkpointing", "activation_checkpoint", "recompute_activations",
        "checkpoint_activations"}},
  };
  return aliases;
}

// What to tell a user about an unknown `path`: what mltrain calls a name from another trainer,
// whatever section it was put in; else the key of that name in its right section; else the
// nearest spelling.
std::string key_hint(const std::string& path) {
  const std::string_view name = std::string_view(path).substr(path.find('.') + 1);
  for (const KeyAliases& aliases : key_aliases()) {
    if (std::find(aliases.names.begin(), aliases.names.end(), name) != aliases.names.end()) {
      return fmt::format("mltrain calls it {}", aliases.path);
    }
  }
  const auto& specs = key_specs();
  const auto same_name = std::find_if(specs.begin(), specs.end(), [&](const KeySpec& spec) {
    return std::string_view(spec.path).substr(spec.path.find('.') + 1) == name;
  });
  if (same_name != specs.end()) return fmt::format("did you mean {}?", same_name->path);
  const auto nearest =
      std::min_element(specs.begin(), specs.end(), [&](const KeySpec& a, const KeySpec& b) {
        return edit_distance(path, a.path) < edit_distance(path, b.path);
      });
  return fmt::format("did you mean {}?", nearest->path);
}

const KeySpec& find_key(const std::string& path, const Origin& origin) {
  const auto& specs = key_specs();
  const auto exact = std::find_if(specs.begin(), specs.end(),
                                  [&](const KeySpec& spec) { return spec.path == path; });
  if (exact != specs.end()) return *exact;
  throw UserError(fmt::format("{}: unknown key {} ({})", origin, path, key_hint(path)));
}

Origin file_origin(const std::filesystem::path& file, const YAML::Node& node) {
  return fmt::format("{}:{}", file.string(), node.Mark().line + 1);
}

// The name of a mapping's key; a key that is not a plain scalar ("? [a, b]: ...") is no key of
// ours.
std::string key_name(const YAML::Node& key, const std::filesystem::path& file) {
  if (!key.IsScalar()) {
    throw UserError(fmt::format("{}: a key must be a plain name, got {}", file_origin(file, key),
                                describe(key)));
  }
  return key.Scalar();
}

// The entries of a mapping by name, each once: YAML parsers keep a repeated key and let the last
// one win, which would hide a mistake that every other key's is an error.
std::vector<std::pair<std::string, YAML::const_iterator>> unique_entries(
    const YAML::Node& mapping, const std::filesystem::path& file, const std::string& section) {
  std::vector<std::pair<std::string, YAML::const_iterator>> entries;
  std::unordered_map<std::string, int> lines;  // of the names seen
  for (auto entry = mapping.begin(); entry != mapping.end(); ++entry) {
    const std::string name = key_name(entry->first, file);
    const auto [seen, first] = lines.emplace(name, entry->first.Mark().line + 1);
    if (!first) {
      throw UserError(fmt::format(
          "{}: {} is given twice, here and at line {}: keep one", file_origin(file, entry->first),
          section.empty() ? fmt::format("section {}", name) : fmt::format("{}.{}", section, name),
          seen->second));
    }
    entries.emplace_back(name, entry);
  }
  return entries;
}

void read_file(Config& config, const std::filesystem::path& file) {
  const std::string text = read_text_file(file, "config file");
  YAML::Node root;
  try {
    std::vector<YAML::Node> documents = YAML::LoadAll(text);
    // An empty document (a stray --- at the end) says nothing.
    std::erase_if(documents, [](const YAML::Node& document) { return document.IsNull(); });
    // A second document (after ---) would be read by nobody: refused, not dropped unread.
    if (documents.size() > 1) {
      throw UserError(
          fmt::format("{}: holds {} YAML documents (separated by --- or ...): a config is one; put "
                      "its sections in "
                      "one, or the others in files of their own",
                      file.string(), documents.size()));
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& error) {
    throw UserError(
        fmt::format("{}:{}: not valid YAML: {}", file.string(), error.mark.line + 1, error.msg));
  }
  if (root.IsNull()) return;  // an empty file keeps every default
  if (!root.IsMap())
    throw UserError(fmt::format("{}: expected a mapping of sections", file.string()));
  for (const auto& [section_name, section] : unique_entries(root, file, "")) {
    if (!section->second.IsMap()) {
      throw UserError(fmt::format("{}: section {} must be a mapping of keys",
                                  file_origin(file, section->first), section_name));
    }
    for (const auto& [key, entry] : unique_entries(section->second, file, section_name)) {
      const Origin origin = file_origin(file, entry->first);
      const std::string path = fmt::format("{}.{}", section_name, key);
      find_key(path, origin).read(config, entry->second, origin);
    }
  }
}

void apply_override(Config& config, const std::string& assignment) {
  const Origin origin = "--set " + assignment;
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || assignment.find('.') > equals) {
    throw UserError(fmt::format("{}: expected section.key=value", origin));
  }
  const std::string path = assignment.substr(0, equals);
  const KeySpec& spec = find_key(path, origin);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(equals + 1));
  } catch (const YAML::ParserException& error) {
    throw UserError(fmt::format("{}: the value is not valid YAML: {}", origin, error.msg));
  }
  spec.read(config, value, origin);
}

// A trillion tokens per step on one rank: thousands of times what any run takes.
constexpr double kMostTokensPerRankStep = 0x1p40;

// The data paths are saved absolute (with_absolute_data_paths): a relative one taken from a
// working directory whose name is not UTF-8 would be written into YAML, which holds Unicode text
// only, as other bytes.
void check_absolute_paths(const Config& config, const std::string& source) {
  std::vector<std::pair<std::string, std::string>> paths = {{"model.init_from", config.init_from}};
  // As with_absolute_data_paths saves them: data.train and data.val beside data.sources are not,
  // nor is a tokenizer that is not there.
  if (config.sources.empty()) {
    paths.emplace_back("data.train", config.data.train);
    paths.emplace_back("data.val", config.data.val);
  }
  if (std::filesystem::exists(config.data.tokenizer))
    paths.emplace_back("data.tokenizer", config.data.tokenizer);
  for (size_t i = 0; i < config.sources.size(); ++i) {
    const std::string entry = fmt::format("data.sources entry {}", i + 1);
    paths.emplace_back(entry + ": train", config.sources[i].train);
    paths.emplace_back(entry + ": val", config.sources[i].val);
  }
  for (const auto& [key, path] : paths) {
    if (path.empty() || std::filesystem::path(path).is_absolute()) continue;
    std::error_code error;
    const std::filesystem::path absolute = std::filesystem::absolute(path, error);
    if (error || !invalid_utf8_at(absolute.string())) continue;
    throw UserError(fmt::format(
        "{}: {} is relative to the working directory {}, whose name is not valid UTF-8: the run "
        "saves its data paths absolute, in YAML, which holds Unicode text only; give it as an "
        "absolute path, or start from a directory with a UTF-8 name",
        source, key, printable_utf8(std::filesystem::current_path(error).string())));
  }
}

// Constraints between keys, checked once every value is known.
void check_consistency(const Config& config, const std::string& source) {
  try {
    config.model.validate();
    config.lora.validate();
  } catch (const UserError& error) {
    throw UserError(fmt::format("{}: {}", source, error.what()));
  }
  if (config.data.document_masking && config.data.eot_token < 0 && config.data.tokenizer.empty()) {
    throw UserError(fmt::format(
        "{}: data.document_masking needs the end-of-document token: set data.tokenizer to take "
        "it from, or data.eot_token to its id",
        source));
  }
  if (config.data.eot_token >= config.model.vocab_size) {
    throw UserError(fmt::format("{}: data.eot_token ({}) is not a token of model.vocab_size = {}",
                                source, config.data.eot_token, config.model.vocab_size));
  }
  if (config.data.seq_len > config.model.max_seq_len) {
    throw UserError(fmt::format("{}: data.seq_len ({}) exceeds model.max_seq_len ({})", source,
                                config.data.seq_len, config.model.max_seq_len));
  }
  // What is counted from a rank's tokens per step (windows, samples, bytes) must stay far inside
  // 64 bits: a slip of a digit should stop here, not overflow later.
  const double tokens = static_cast<double>(config.data.micro_batch) *
                        static_cast<double>(config.data.grad_accum) *
                        static_cast<double>(config.data.seq_len);
  if (tokens > kMostTokensPerRankStep) {
    throw UserError(fmt::format(
        "{}: data.micro_batch ({}) x data.grad_accum ({}) x data.seq_len ({}) is {:.3g} tokens per "
        "step and rank, more than mltrain takes ({:.3g})",
        source, config.data.micro_batch, config.data.grad_accum, config.data.seq_len, tokens,
        kMostTokensPerRankStep));
  }
  if (config.train.spike_guard != 0.0 && config.train.spike_guard <= 1.0) {
    throw UserError(fmt::format(
        "{}: train.spike_guard ({}) must be 0 (off) or above 1: a step is skipped when its loss "
        "exceeds this many times the running level",
        source, config.train.spike_guard));
  }
  if (config.train.run_dir.empty())
    throw UserError(
        fmt::format("{}: train.run_dir is empty: name the directory the run writes", source));
  if (config.optim.warmup_steps > config.train.max_steps) {
    throw UserError(fmt::format("{}: optim.warmup_steps ({}) exceeds train.max_steps ({})", source,
                                config.optim.warmup_steps, config.train.max_steps));
  }
  check_data_sources(config, source);
  if (config.optim.name == "muon" && config.optim.lr == 0.0 && config.optim.muon_lr > 0.0) {
    throw UserError(fmt::format(
        "{}: optim.muon_lr ({}) is scaled by the schedule of optim.lr, which is 0: give optim.lr "
        "a peak too",
        source, config.optim.muon_lr));
  }
  try {
    profile_step_range(config.train.profile_steps);
  } catch (const UserError& error) {
    throw UserError(fmt::format("{}: {}", source, error.what()));
  }
  if (const std::string& rendezvous = config.dist.rendezvous;
      rendezvous != "tcp" && (!rendezvous.starts_with("file:") || rendezvous.size() == 5)) {
    throw UserError(fmt::format(
        "{}: dist.rendezvous must be tcp or file:PATH (a file every rank can reach), got \"{}\"",
        source, rendezvous));
  }
  if (config.optim.min_lr > config.optim.lr) {
    throw UserError(fmt::format("{}: optim.min_lr ({}) exceeds optim.lr ({})", source,
                                config.optim.min_lr, config.optim.lr));
  }
  if (config.dist.zero_stage >= 2 && config.optim.name == "muon") {
    throw UserError(fmt::format(
        "{}: dist.zero_stage {} keeps each rank's part of every gradient only, and Muon "
        "orthogonalises whole matrices: with optim.name muon use dist.zero_stage 1, which shards "
        "its state by matrix",
        source, config.dist.zero_stage));
  }
  if (config.lora.enabled() && config.dist.zero_stage == 3) {
    throw UserError(fmt::format(
        "{}: lora.rank {} trains adapters only, and dist.zero_stage 3 shards the frozen weights "
        "too, which LoRA does not do yet: use dist.zero_stage 0, 1 or 2 (the adapters' state is "
        "small; the frozen weights are whole on every rank)",
        source, config.lora.rank));
  }
  if (config.lora.enabled() && config.optim.name == "muon") {
    throw UserError(fmt::format(
        "{}: lora.rank {} trains low-rank adapters, which optim.name muon does not orthogonalise: "
        "use optim.name adamw",
        source, config.lora.rank));
  }
  if (config.dist.shard_ranks > 0 && config.dist.zero_stage == 0) {
    throw UserError(fmt::format(
        "{}: dist.shard_ranks {} groups the ranks that share what dist.zero_stage 1, 2 or 3 "
        "shards, and dist.zero_stage is 0: every rank holds everything whole",
        source, config.dist.shard_ranks));
  }
  check_absolute_paths(config, source);
}

}  // namespace

Config load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  Config config;
  read_file(config, file);
  for (const std::string& assignment : overrides) apply_override(config, assignment);
  check_consistency(config, file.string());
  return config;
}

std::string config_to_yaml(const Config& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open_section;
  for (const KeySpec& spec : key_specs()) {
    const size_t dot = spec.path.find('.');
    const std::string section = spec.path.substr(0, dot);
    if (section != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << spec.path.substr(dot + 1) << YAML::Value;
    if (spec.emit) {
      spec.emit(out, config);
      continue;
    }
    if (spec.quoted) out << YAML::DoubleQuoted;
    out << spec.show(config);
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::optional<StepRange> profile_step_range(const std::string& text) {
  if (text.empty()) return std::nullopt;
  StepRange range;
  const char* const end = text.data() + text.size();
  const auto [after_first, first_error] = std::from_chars(text.data(), end, range.first);
  const bool dash = first_error == std::errc() && after_first != end && *after_first == '-';
  const auto [after_last, last_error] =
      dash ? std::from_chars(after_first + 1, end, range.last)
           : std::from_chars_result{after_first, std::errc::invalid_argument};
  if (!dash || last_error != std::errc() || after_last != end || range.first < 1 ||
      range.first > range.last) {
    throw UserError(fmt::format(
        "train.profile_steps must be FIRST-LAST with 1 <= FIRST <= LAST (e.g. 20-22), got \"{}\"",
        text));
  }
  return range;
}

Config with_absolute_data_paths(Config config) {
  if (!std::filesystem::exists(config.data.tokenizer)) config.data.tokenizer.clear();
  for (std::string* path :
       {&config.data.train, &config.data.val, &config.data.tokenizer, &config.init_from}) {
    // Beside data.sources, data.train and data.val are not read: they stay as given.
    const bool unused =
        !config.sources.empty() && (path == &config.data.train || path == &config.data.val);
    if (!path->empty() && !unused)
      *path = std::filesystem::absolute(*path).lexically_normal().string();
  }
  for (DataSource& source : config.sources) {
    for (std::string* path : {&source.train, &source.val})
      *path = std::filesystem::absolute(*path).lexically_normal().string();
  }
  return config;
}

std::vector<ConfigChange> config_changes(const Config& before, const Config& after) {
  std::vector<ConfigChange> changes;
  for (const KeySpec& spec : key_specs()) {
    const std::string old_value = spec.show(before);
    const std::string new_value = spec.show(after);
    if (old_value != new_value) changes.push_back({spec.path, old_value, new_value});
  }
  return changes;
}

std::string config_reference_markdown() {
  const Config defaults;
  std::string text = "| key | default | meaning |\n| --- | --- | --- |\n";
  for (const KeySpec& spec : key_specs()) {
    // An empty default is shown as YAML spells it; an empty code span would not show at all.
    const std::string value = spec.show(defaults);
    text += fmt::format("| `{}` | `{}` | {} |\n", spec.path, value.empty() ? "\"\"" : value,
                        spec.description);
  }
  return text;
}

}  // namespace mltrain
