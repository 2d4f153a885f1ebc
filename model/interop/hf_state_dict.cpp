#include "model/interop/hf_state_dict.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace mltrain {
namespace {

// A parameter inside a block: our name, Hugging Face's (vLLM's for a fused projection), and the
// Hugging Face tensors it holds row after row with their rows; none when it holds only itself.
struct BlockParameter {
  std::string_view ours;
  std::string_view theirs;
  std::vector<std::pair<std::string_view, int64_t>> parts;
};

std::vector<BlockParameter> block_parameters(const ModelConfig& config) {
  const int64_t q = config.n_q_heads * config.head_dim;
  const int64_t kv = config.n_kv_heads * config.head_dim;
  return {
      {"attn_norm.weight", "input_layernorm.weight", {}},
      {"attn.wqkv.weight",
       "self_attn.qkv_proj.weight",
       {{"self_attn.q_proj.weight", q},
        {"self_attn.k_proj.weight", kv},
        {"self_attn.v_proj.weight", kv}}},
      {"attn.wo.weight", "self_attn.o_proj.weight", {}},
      {"ffn_norm.weight", "post_attention_layernorm.weight", {}},
      {"ffn.w_gate_up.weight",
       "mlp.gate_up_proj.weight",
       {{"mlp.gate_proj.weight", config.d_ffn}, {"mlp.up_proj.weight", config.d_ffn}}},
      {"ffn.w_down.weight", "mlp.down_proj.weight", {}},
  };
}

// The Hugging Face projection that each of lora.targets names.
const std::map<std::string_view, std::string_view>& adapted_projections() {
  static const std::map<std::string_view, std::string_view> projections = {
      {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"}, {"v", "self_attn.v_proj"},
      {"o", "self_attn.o_proj"}, {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"},
      {"down", "mlp.down_proj"}};
  return projections;
}

// A LoRA parameter's name inside its block ("attn.wqkv_lora.q_A": model/layers/lora.h) as PEFT
// names it on the projection it adapts ("self_attn.q_proj.lora_A.weight"); none for another.
std::optional<std::string> hf_adapter_name(std::string_view name) {
  if (name.find("_lora.") == std::string_view::npos) return std::nullopt;
  const std::string_view parameter = name.substr(name.rfind('.') + 1);
  const size_t underscore = parameter.rfind('_');
  return fmt::format("{}.lora_{}.weight", adapted_projections().at(parameter.substr(0, underscore)),
                     parameter.substr(underscore + 1));
}

bool is_hf_adapter_name(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

// `name`, a parameter inside block `prefix` ("model.layers.3."), under Hugging Face's names.
NamedParameter hf_block_parameter(const std::string& prefix, std::string_view name,
                                  const at::Tensor& tensor, const ModelConfig& config) {
  if (const auto adapter = hf_adapter_name(name))
    return unfused_parameter(prefix + *adapter, tensor);
  for (const BlockParameter& known : block_parameters(config)) {
    if (name != known.ours) continue;
    if (known.parts.empty()) return unfused_parameter(prefix + std::string(known.theirs), tensor);
    NamedParameter fused{.name = prefix + std::string(known.theirs), .tensor = tensor, .parts = {}};
    int64_t first_row = 0;
    for (const auto& [theirs, rows] : known.parts) {
      fused.parts.push_back(
          {.name = prefix + std::string(theirs), .first_row = first_row, .rows = rows});
      first_row += rows;
    }
    if (first_row != tensor.size(0))
      throw std::logic_error(
          fmt::format("{} has {} rows, its parts {}", fused.name, tensor.size(0), first_row));
    return fused;
  }
  throw std::logic_error(fmt::format("no Hugging Face name for parameter {}", name));
}

bool holds_adapters(const std::map<std::string, SafetensorsEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(),
                     [](const auto& entry) { return is_hf_adapter_name(entry.first); });
}

std::string shape_text(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Every entry of a file (or of tensors) checked against the model's tensors by Hugging Face
// name, from their shapes alone (a parameter without bytes has them): missing, unexpected, wrongly
// shaped or non-floating tensors are one UserError that names `source` and lists every offending
// key. The rotary tables that older transformers saved are passed over: they hold nothing that
// config.json does not. The model's LoRA adapters are expected only where the entries hold some
// (a checkpoint of a LoRA run; a Hugging Face model has none, and the adapters keep their draw).
void check_against_model(const Llama& model, const std::map<std::string, SafetensorsEntry>& entries,
                         const std::string& source) {
  std::vector<std::string> problems;
  std::map<std::string, std::vector<int64_t>> expected;
  const bool adapters = holds_adapters(entries);
  for (const NamedParameter& parameter : hf_parameters(model)) {
    if (!adapters && is_hf_adapter_name(parameter.name)) continue;
    for (const ParameterPart& part : parameter.parts) {
      std::vector<int64_t> shape = parameter.tensor.sizes().vec();
      shape.front() = part.rows;
      expected.emplace(part.name, std::move(shape));
    }
  }
  for (const auto& [name, shape] : expected) {
    const auto found = entries.find(name);
    if (found == entries.end()) {
      problems.push_back(fmt::format("missing {}", name));
    } else if (!at::isFloatingType(found->second.dtype)) {
      problems.push_back(
          fmt::format("{} has non-floating dtype {}", name, c10::toString(found->second.dtype)));
    } else if (found->second.shape != shape) {
      problems.push_back(fmt::format("{} has shape {} in the file, {} in the model", name,
                                     shape_text(found->second.shape), shape_text(shape)));
    }
  }
  for (const auto& [name, entry] : entries) {
    if (expected.contains(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    problems.push_back(name == "lm_head.weight"
                           ? "unexpected lm_head.weight (this model ties it to the embeddings: "
                             "model.tie_word_embeddings)"
                       : is_hf_adapter_name(name)
                           ? fmt::format("unexpected {} (LoRA's: set the run's lora.rank, alpha "
                                         "and targets)",
                                         name)
                           : fmt::format("unexpected {}", name));
  }
  if (!problems.empty()) {
    throw UserError(
        fmt::format("{} does not match the model: {}", source, fmt::join(problems, "; ")));
  }
}

}  // namespace

NamedParameters hf_parameters(const Llama& model) {
  NamedParameters named;
  const std::string_view layers_prefix = "layers.";
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    if (name == "token_embeddings.weight") {
      named.push_back(unfused_parameter("model.embed_tokens.weight", item.value()));
    } else if (name == "norm.weight") {
      named.push_back(unfused_parameter("model.norm.weight", item.value()));
    } else if (name == "lm_head.weight") {
      named.push_back(unfused_parameter(name, item.value()));
    } else if (name.starts_with(layers_prefix)) {
      const size_t index_end = name.find('.', layers_prefix.size());
      named.push_back(hf_block_parameter(fmt::format("model.{}.", name.substr(0, index_end)),
                                         std::string_view(name).substr(index_end + 1), item.value(),
                                         model->config()));
    } else {
      throw std::logic_error("no Hugging Face name for parameter " + name);
    }
  }
  return named;
}

NamedTensors hf_state_dict(const Llama& model) {
  NamedTensors state;
  for (const NamedParameter& parameter : hf_parameters(model)) {
    for (const ParameterPart& part : parameter.parts)
      state.emplace(part.name, part_of(parameter.tensor.detach(), part));
  }
  return state;
}

void load_hf_state_dict(Llama& model, const NamedTensors& tensors, const std::string& source) {
  std::map<std::string, SafetensorsEntry> entries;
  for (const auto& [name, tensor] : tensors) {
    entries.emplace(
        name, SafetensorsEntry{
                  .name = name, .dtype = tensor.scalar_type(), .shape = tensor.sizes().vec()});
  }
  check_against_model(model, entries, source);
  const bool adapters = holds_adapters(entries);
  at::NoGradGuard no_grad;
  for (const auto& [name, parameter] : hf_state_dict(model))
    if (adapters || !is_hf_adapter_name(name)) parameter.copy_(tensors.at(name));
}

void load_hf_weights(Llama& model, const WeightFiles& files,
                     const std::vector<at::Tensor>& parameters) {
  check_against_model(model, files.entries(), files.source());
  const bool adapters = holds_adapters(files.entries());
  for (const NamedParameter& parameter : hf_parameters(model)) {
    if (!adapters && is_hf_adapter_name(parameter.name)) continue;
    const bool wanted =
        parameters.empty() ||
        std::any_of(parameters.begin(), parameters.end(), [&](const at::Tensor& given) {
          return given.unsafeGetTensorImpl() == parameter.tensor.unsafeGetTensorImpl();
        });
    if (!wanted) continue;
    for (const ParameterPart& part : parameter.parts)
      files.read_into(part.name, part_of(parameter.tensor.detach(), part));
  }
}

const std::map<std::string, std::string>& hf_weights_metadata() {
  static const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  return metadata;
}

void save_state_dict(const NamedTensors& state_dict, const std::filesystem::path& path) {
  save_safetensors(path, state_dict, hf_weights_metadata());
}

void save_model_weights(const Llama& model, const std::filesystem::path& path) {
  save_state_dict(hf_state_dict(model), path);
}

void load_model_weights(Llama& model, const std::filesystem::path& path) {
  load_hf_weights(model, WeightFiles(path));
}

void check_weights_can_fill(const ModelConfig& config, const std::string& config_source,
                            const std::filesystem::path& path) {
  std::error_code error;
  const auto bytes = std::filesystem::file_size(path, error);
  if (error) return;  // reading the weights names what is wrong with them
  const double least = 2.0 * static_cast<double>(config.parameters());
  if (static_cast<double>(bytes) >= least) return;
  throw UserError(fmt::format(
      "{}: a model of {} parameters, and {} holds {} bytes, fewer than they take even in bf16: "
      "the weights are not of that model",
      config_source, config.parameters(), path.string(), bytes));
}

}  // namespace mltrain
