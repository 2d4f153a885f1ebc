#include "model/interop/hf_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <type_traits>

#include "common/error.h"
#include "common/json_text.h"
#include "common/type_name.h"

namespace mltrain {
namespace {

using Json = nlohmann::json;

template <class T>
bool holds(const Json& value) {
  if constexpr (std::is_same_v<T, bool>) return value.is_boolean();
  if constexpr (std::is_same_v<T, int64_t>) return value.is_number_integer();
  if constexpr (std::is_same_v<T, double>) return value.is_number();
  if constexpr (std::is_same_v<T, std::string>) return value.is_string();
}

// The value of `key`, or `fallback` (LlamaConfig's default) where it is absent or null, which is
// how transformers reads it.
template <class T>
T value_or(const Json& json, const char* key, T fallback, const std::string& source) {
  const auto found = json.find(key);
  if (found == json.end() || found->is_null()) return fallback;
  if (!holds<T>(*found)) {
    throw UserError(fmt::format("{}: \"{}\" must be {}, got {}", source, key, type_name<T>(),
                                json_value_text(*found)));
  }
  return found->get<T>();
}

// A special token id: LlamaConfig's default where absent, none where null; of a list (several
// end tokens), the first.
std::optional<int64_t> token_id(const Json& json, const char* key, int64_t fallback,
                                const std::string& source) {
  const auto found = json.find(key);
  if (found == json.end()) return fallback;
  if (found->is_null()) return std::nullopt;
  if (found->is_array() && !found->empty() && found->front().is_number_integer())
    return found->front().get<int64_t>();
  if (found->is_number_integer()) return found->get<int64_t>();
  throw UserError(fmt::format("{}: \"{}\" must be a token id or a list of them, got {}", source,
                              key, json_value_text(*found)));
}

// The RoPE base. Older versions keep it at the top level and scaling in "rope_scaling";
// transformers 5 keeps both in "rope_parameters" (and, as it does, "rope_scaling" wins).
double rope_theta(const Json& json, const std::string& source) {
  const double top_level = value_or(json, "rope_theta", 10000.0, source);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto rope = json.find(key);
    if (rope == json.end() || rope->is_null()) continue;
    if (!rope->is_object()) {
      throw UserError(fmt::format("{}: \"{}\" must be a JSON object, got {}", source, key,
                                  json_value_text(*rope)));
    }
    const std::string type = value_or<std::string>(
        *rope, "rope_type", value_or<std::string>(*rope, "type", "default", source), source);
    if (type != "default") {
      throw UserError(fmt::format(
          "{}: {} of type \"{}\" is not supported: mltrain's model computes default (unscaled) "
          "rotary embeddings only",
          source, key, type));
    }
    return value_or(*rope, "rope_theta", top_level, source);
  }
  return top_level;
}

// Features of LlamaForCausalLM that mltrain's model does not compute.
void check_supported(const Json& json, const std::string& source) {
  const std::string model_type = value_or<std::string>(json, "model_type", "", source);
  if (model_type != "llama") {
    throw UserError(
        fmt::format("{}: model_type is \"{}\": mltrain's model is a LLaMA (model_type \"llama\")",
                    source, model_type));
  }
  const std::string activation = value_or<std::string>(json, "hidden_act", "silu", source);
  if (activation != "silu") {
    throw UserError(fmt::format(
        "{}: hidden_act \"{}\" is not supported: mltrain's feed-forward is SwiGLU (silu)", source,
        activation));
  }
  if (value_or(json, "attention_bias", false, source)) {
    throw UserError(fmt::format(
        "{}: attention_bias is true, which is not supported: mltrain's attention has no biases",
        source));
  }
  if (value_or(json, "mlp_bias", false, source)) {
    throw UserError(fmt::format(
        "{}: mlp_bias is true, which is not supported: mltrain's feed-forward has no biases",
        source));
  }
}

Json id_or_null(const std::optional<int64_t>& id) { return id ? Json(*id) : Json(nullptr); }

template <class T>
void compare(std::vector<ModelKeyDifference>& differences, const char* key, const T& ours,
             const T& theirs) {
  if (ours != theirs) {
    differences.push_back(
        {fmt::format("model.{}", key), fmt::format("{}", ours), fmt::format("{}", theirs)});
  }
}

}  // namespace

std::string hf_config_json(const HfConfig& config) {
  const ModelConfig& model = config.model;
  const nlohmann::ordered_json json = {
      {"architectures", nlohmann::ordered_json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"vocab_size", model.vocab_size},
      {"hidden_size", model.d_model},
      {"intermediate_size", model.d_ffn},
      {"num_hidden_layers", model.n_layers},
      {"num_attention_heads", model.n_q_heads},
      {"num_key_value_heads", model.n_kv_heads},
      {"head_dim", model.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", model.max_seq_len},
      {"rms_norm_eps", model.norm_eps},
      {"rope_theta", model.rope_theta},
      {"rope_parameters", {{"rope_theta", model.rope_theta}, {"rope_type", "default"}}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"tie_word_embeddings", model.tie_word_embeddings},
      {"initializer_range", model.init_std},
      {"bos_token_id", id_or_null(config.bos_token_id)},
      {"eos_token_id", id_or_null(config.eos_token_id)},
      {"dtype", "float32"},
      {"torch_dtype", "float32"},
      {"use_cache", true},
  };
  return json_text(json, 2) + "\n";
}

std::string hf_generation_config_json(const HfConfig& config) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (config.bos_token_id) json["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_id) json["eos_token_id"] = *config.eos_token_id;
  return json_text(json, 2) + "\n";
}

HfConfig parse_hf_config(const std::string& text, const std::string& source) {
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::parse_error& error) {
    throw UserError(fmt::format("{}: not valid JSON ({})", source, error.what()));
  }
  if (!json.is_object()) throw UserError(fmt::format("{}: expected a JSON object", source));
  check_supported(json, source);

  HfConfig config;
  ModelConfig& model = config.model;
  model.vocab_size = value_or<int64_t>(json, "vocab_size", 32000, source);
  model.d_model = value_or<int64_t>(json, "hidden_size", 4096, source);
  model.d_ffn = value_or<int64_t>(json, "intermediate_size", 11008, source);
  model.n_layers = value_or<int64_t>(json, "num_hidden_layers", 32, source);
  model.n_q_heads = value_or<int64_t>(json, "num_attention_heads", 32, source);
  model.n_kv_heads = value_or<int64_t>(json, "num_key_value_heads", model.n_q_heads, source);
  model.head_dim = value_or<int64_t>(
      json, "head_dim", model.n_q_heads > 0 ? model.d_model / model.n_q_heads : 0, source);
  model.max_seq_len = value_or<int64_t>(json, "max_position_embeddings", 2048, source);
  model.rope_theta = rope_theta(json, source);
  model.norm_eps = value_or(json, "rms_norm_eps", 1e-6, source);
  model.tie_word_embeddings = value_or(json, "tie_word_embeddings", false, source);
  model.init_std = value_or(json, "initializer_range", 0.02, source);
  try {
    model.validate();
  } catch (const UserError& error) {
    throw UserError(fmt::format("{}: {}", source, error.what()));
  }
  config.bos_token_id = token_id(json, "bos_token_id", 1, source);
  config.eos_token_id = token_id(json, "eos_token_id", 2, source);
  return config;
}

std::vector<ModelKeyDifference> model_differences(const ModelConfig& ours,
                                                  const ModelConfig& theirs) {
  std::vector<ModelKeyDifference> differences;
  compare(differences, "vocab_size", ours.vocab_size, theirs.vocab_size);
  compare(differences, "d_model", ours.d_model, theirs.d_model);
  compare(differences, "n_layers", ours.n_layers, theirs.n_layers);
  compare(differences, "n_q_heads", ours.n_q_heads, theirs.n_q_heads);
  compare(differences, "n_kv_heads", ours.n_kv_heads, theirs.n_kv_heads);
  compare(differences, "head_dim", ours.head_dim, theirs.head_dim);
  compare(differences, "d_ffn", ours.d_ffn, theirs.d_ffn);
  compare(differences, "rope_theta", ours.rope_theta, theirs.rope_theta);
  compare(differences, "norm_eps", ours.norm_eps, theirs.norm_eps);
  compare(differences, "tie_word_embeddings", ours.tie_word_embeddings, theirs.tie_word_embeddings);
  return differences;
}

}  // namespace mltrain
