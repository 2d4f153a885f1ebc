#include "model/hf_state_dict.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <utility>
#include <vector>

#include "common/error.h"

namespace mltrain {
namespace {

// Names inside a block, ours -> Hugging Face's.
constexpr std::array<std::pair<std::string_view, std::string_view>, 9> kBlockNames{{
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn.wq.weight", "self_attn.q_proj.weight"},
    {"attn.wk.weight", "self_attn.k_proj.weight"},
    {"attn.wv.weight", "self_attn.v_proj.weight"},
    {"attn.wo.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn.w_gate.weight", "mlp.gate_proj.weight"},
    {"ffn.w_up.weight", "mlp.up_proj.weight"},
    {"ffn.w_down.weight", "mlp.down_proj.weight"},
}};

std::string shape_text(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::string hf_parameter_name(const std::string& name) {
  if (name == "token_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "lm_head.weight") return name;
  const std::string_view layers_prefix = "layers.";
  if (name.starts_with(layers_prefix)) {
    const size_t index_end = name.find('.', layers_prefix.size());
    const std::string_view rest = std::string_view(name).substr(index_end + 1);
    for (const auto& [ours, theirs] : kBlockNames) {
      if (rest == ours) return fmt::format("model.{}.{}", name.substr(0, index_end), theirs);
    }
  }
  throw std::logic_error("no Hugging Face name for parameter " + name);
}

std::vector<std::pair<std::string, at::Tensor>> hf_named_parameters(const Llama& model) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model->named_parameters()) {
    named.emplace_back(hf_parameter_name(item.key()), item.value());
  }
  return named;
}

NamedTensors hf_state_dict(const Llama& model) {
  NamedTensors state;
  for (const auto& [name, parameter] : hf_named_parameters(model))
    state.emplace(name, parameter.detach());
  return state;
}

void load_hf_state_dict(Llama& model, const NamedTensors& tensors, const std::string& source) {
  std::vector<std::string> problems;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (parameter, value)
  NamedTensors expected = hf_state_dict(model);
  for (const auto& [name, parameter] : expected) {
    const auto found = tensors.find(name);
    if (found == tensors.end()) {
      problems.push_back(fmt::format("missing {}", name));
    } else if (!at::isFloatingType(found->second.scalar_type())) {
      problems.push_back(fmt::format("{} has non-floating dtype {}", name,
                                     c10::toString(found->second.scalar_type())));
    } else if (found->second.sizes() != parameter.sizes()) {
      problems.push_back(fmt::format("{} has shape {} in the file, {} in the model", name,
                                     shape_text(found->second.sizes()),
                                     shape_text(parameter.sizes())));
    } else {
      copies.emplace_back(parameter, found->second);
    }
  }
  for (const auto& [name, tensor] : tensors) {
    if (!expected.contains(name)) {
      problems.push_back(name == "lm_head.weight"
                             ? "unexpected lm_head.weight (this model ties it to the embeddings: "
                               "model.tie_word_embeddings)"
                             : fmt::format("unexpected {}", name));
    }
  }
  if (!problems.empty()) {
    throw UserError(
        fmt::format("{} does not match the model: {}", source, fmt::join(problems, "; ")));
  }
  at::NoGradGuard no_grad;
  for (auto& [parameter, value] : copies) parameter.copy_(value);
}

void save_state_dict(const NamedTensors& state_dict, const std::filesystem::path& path) {
  save_safetensors(path, state_dict, {{"format", "pt"}});
}

void save_model_weights(const Llama& model, const std::filesystem::path& path) {
  save_state_dict(hf_state_dict(model), path);
}

void load_model_weights(Llama& model, const std::filesystem::path& path) {
  load_hf_state_dict(model, load_safetensors(path), path.string());
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
