#include "trainer/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
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
};

// The limits a value must respect; each key sets the ones that apply.
struct Limits {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;
};

Limits at_least(double min) { return Limits{min, std::numeric_limits<double>::infinity(), {}}; }
Limits between(double min, double max) { return Limits{min, max, {}}; }
Limits one_of(std::vector<std::string> choices) {
  return Limits{-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                std::move(choices)};
}

template <class T>
void check_limits(const T& value, const Limits& limits, const std::string& path,
                  const Origin& origin) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!limits.choices.empty() &&
        std::find(limits.choices.begin(), limits.choices.end(), value) == limits.choices.end()) {
      throw UserError(fmt::format("{}: {} must be one of {}, got \"{}\"", origin, path,
                                  fmt::join(limits.choices, ", "), value));
    }
  } else if constexpr (!std::is_same_v<T, bool>) {
    const double number = static_cast<double>(value);
    if (!(number >= limits.min) || !(number <= limits.max)) {
      const std::string range = limits.max == std::numeric_limits<double>::infinity()
                                    ? fmt::format("at least {}", limits.min)
                                    : fmt::format("between {} and {}", limits.min, limits.max);
      throw UserError(fmt::format("{}: {} must be {}, got {}", origin, path, range, value));
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

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      key(&Config::model, &ModelConfig::vocab_size, "model.vocab_size", "tokens in the vocabulary",
          at_least(1)),
      key(&Config::model, &ModelConfig::d_model, "model.d_model", "width of the residual stream",
          at_least(1)),
      key(&Config::model, &ModelConfig::n_layers, "model.n_layers", "decoder blocks", at_least(1)),
      key(&Config::model, &ModelConfig::n_q_heads, "model.n_q_heads",
          "query heads per attention layer", at_least(1)),
      key(&Config::model, &ModelConfig::n_kv_heads, "model.n_kv_heads",
          "key/value heads (grouped-query attention); divides n_q_heads", at_least(1)),
      key(&Config::model, &ModelConfig::head_dim, "model.head_dim",
          "width of one attention head (even)", at_least(2)),
      key(&Config::model, &ModelConfig::d_ffn, "model.d_ffn",
          "hidden width of the SwiGLU feed-forward", at_least(1)),
      key(&Config::model, &ModelConfig::max_seq_len, "model.max_seq_len",
          "longest sequence the rotary tables cover", at_least(1)),
      key(&Config::model, &ModelConfig::rope_theta, "model.rope_theta", "rotary embedding base",
          at_least(1)),
      key(&Config::model, &ModelConfig::norm_eps, "model.norm_eps", "RMSNorm epsilon", at_least(0)),
      key(&Config::model, &ModelConfig::tie_word_embeddings, "model.tie_word_embeddings",
          "output projection shares the embedding matrix"),
      key(&Config::model, &ModelConfig::init_std, "model.init_std",
          "standard deviation of the initial weights", at_least(0)),
      key(&Config::init_from, "model.init_from",
          "Hugging Face LLaMA directory whose weights a fresh run starts from; its config.json "
          "must match the model.* keys (empty: seeded initial weights)"),

      key(&Config::data, &DataConfig::train, "data.train", "glob of training token shards"),
      key(&Config::data, &DataConfig::val, "data.val", "glob of validation token shards"),
      key(&Config::data, &DataConfig::tokenizer, "data.tokenizer",
          "SentencePiece model of the shards (empty: none)"),
      key(&Config::data, &DataConfig::seq_len, "data.seq_len",
          "tokens per training sequence (<= model.max_seq_len)", at_least(1)),
      key(&Config::data, &DataConfig::micro_batch, "data.micro_batch",
          "sequences per rank per forward pass", at_least(1)),
      key(&Config::data, &DataConfig::grad_accum, "data.grad_accum",
          "micro-steps accumulated per optimizer step", at_least(1)),
      key(&Config::data, &DataConfig::seed, "data.seed",
          "seed of the sample order and the initial weights", at_least(0)),
      key(&Config::data, &DataConfig::prefetch, "data.prefetch", "batches the loader keeps ready",
          at_least(1)),

      key(&Config::optim, &OptimConfig::lr, "optim.lr", "peak learning rate", at_least(0)),
      key(&Config::optim, &OptimConfig::min_lr, "optim.min_lr",
          "learning rate at the end of the decay", at_least(0)),
      key(&Config::optim, &OptimConfig::warmup_steps, "optim.warmup_steps",
          "steps of linear warmup (<= train.max_steps)", at_least(0)),
      key(&Config::optim, &OptimConfig::schedule, "optim.schedule",
          "learning-rate schedule after warmup", one_of({"cosine", "constant", "linear", "wsd"})),
      key(&Config::optim, &OptimConfig::beta1, "optim.beta1", "AdamW first-moment decay",
          between(0, 1)),
      key(&Config::optim, &OptimConfig::beta2, "optim.beta2", "AdamW second-moment decay",
          between(0, 1)),
      key(&Config::optim, &OptimConfig::eps, "optim.eps", "AdamW epsilon", at_least(0)),
      key(&Config::optim, &OptimConfig::weight_decay, "optim.weight_decay",
          "decoupled weight decay of matrices (not norms)", at_least(0)),
      key(&Config::optim, &OptimConfig::grad_clip, "optim.grad_clip",
          "clip the global gradient norm to this (0: off)", at_least(0)),
      key(&Config::optim, &OptimConfig::decay_fraction, "optim.decay_fraction",
          "share of all steps the wsd schedule decays over", between(0, 1)),

      key(&Config::train, &TrainConfig::max_steps, "train.max_steps", "optimizer steps of the run",
          at_least(1)),
      key(&Config::train, &TrainConfig::precision, "train.precision",
          "auto (bf16 where it is faster than fp32: CUDA, CPUs with AMX-BF16; else fp32), bf16 "
          "(autocast, fp32 master weights) or fp32",
          one_of({"auto", "bf16", "fp32"})),
      key(&Config::train, &TrainConfig::kernels, "train.kernels",
          "fused (mltrain's kernels and the chunked loss) or aten (the plain ATen layers)",
          one_of({"fused", "aten"})),
      key(&Config::train, &TrainConfig::device, "train.device",
          "auto (CUDA when present), cpu or cuda", one_of({"auto", "cpu", "cuda"})),
      key(&Config::train, &TrainConfig::threads, "train.threads",
          "CPU intra-op threads (0: all cores)", at_least(0)),
      key(&Config::train, &TrainConfig::run_dir, "train.run_dir",
          "directory of metrics, config and checkpoints, owned by one training run at a time "
          "(RUN_DIR/run.lock)"),
      key(&Config::train, &TrainConfig::log_every, "train.log_every",
          "steps between progress lines", at_least(1)),
      key(&Config::train, &TrainConfig::eval_every, "train.eval_every", "steps between validations",
          at_least(1)),
      key(&Config::train, &TrainConfig::eval_batches, "train.eval_batches",
          "validation batches per evaluation (0: all)", at_least(0)),
      key(&Config::train, &TrainConfig::ckpt_every, "train.ckpt_every", "steps between checkpoints",
          at_least(1)),
      key(&Config::train, &TrainConfig::keep_last, "train.keep_last",
          "checkpoints kept on a rolling basis", at_least(1)),
      key(&Config::train, &TrainConfig::keep_every, "train.keep_every",
          "checkpoints at multiples of this step are kept for good (0: none)", at_least(0)),
      key(&Config::train, &TrainConfig::stop_at, "train.stop_at",
          "stop with a checkpoint once this many steps are done, to resume later (0: run to "
          "max_steps)",
          at_least(0)),
      key(&Config::train, &TrainConfig::max_bad_steps, "train.max_bad_steps",
          "non-finite steps in a row (each skipped) before the run stops", at_least(1)),
      key(&Config::train, &TrainConfig::activation_checkpointing, "train.activation_checkpointing",
          "keep only each block's input in forward and recompute the block in backward: activation "
          "memory falls several times (8x on a 297M model) for one more forward pass of the "
          "blocks"),
      key(&Config::train, &TrainConfig::check_memory, "train.check_memory",
          "refuse to start a run whose memory plan exceeds the device's memory (false: warn and "
          "start)"),

      key(&Config::dist, &DistConfig::backend, "dist.backend",
          "auto (NCCL on CUDA, MPI on CPU), nccl or mpi", one_of({"auto", "nccl", "mpi"})),
      key(&Config::dist, &DistConfig::bucket_mb, "dist.bucket_mb",
          "gradient all-reduce bucket size in MiB", at_least(0.001)),
      key(&Config::dist, &DistConfig::overlap, "dist.overlap",
          "all-reduce buckets while backward runs: auto (on CUDA, not on the CPU, where MPI "
          "makes no progress meanwhile), true or false",
          one_of({"auto", "true", "false"})),
      key(&Config::dist, &DistConfig::grad_dtype, "dist.grad_dtype",
          "dtype of the gradient all-reduce", one_of({"fp32", "bf16"})),
      key(&Config::dist, &DistConfig::zero_stage, "dist.zero_stage",
          "0: every rank holds the whole optimizer state; 1 (ZeRO-1): each rank holds and updates "
          "1/N of it, gradients are reduce-scattered and the weights all-gathered",
          between(0, 1)),
      key(&Config::dist, &DistConfig::timeout_s, "dist.timeout_s",
          "seconds before a stuck collective is an error", at_least(1)),
  };
  return specs;
}

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
    root = YAML::Load(text);
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

// Constraints between keys, checked once every value is known.
void check_consistency(const Config& config, const std::string& source) {
  try {
    config.model.validate();
  } catch (const UserError& error) {
    throw UserError(fmt::format("{}: {}", source, error.what()));
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
  if (config.train.run_dir.empty())
    throw UserError(
        fmt::format("{}: train.run_dir is empty: name the directory the run writes", source));
  if (config.optim.warmup_steps > config.train.max_steps) {
    throw UserError(fmt::format("{}: optim.warmup_steps ({}) exceeds train.max_steps ({})", source,
                                config.optim.warmup_steps, config.train.max_steps));
  }
  if (config.optim.min_lr > config.optim.lr) {
    throw UserError(fmt::format("{}: optim.min_lr ({}) exceeds optim.lr ({})", source,
                                config.optim.min_lr, config.optim.lr));
  }
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
    if (spec.quoted) out << YAML::DoubleQuoted;
    out << spec.show(config);
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
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
