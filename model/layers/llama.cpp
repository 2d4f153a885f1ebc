#include "model/layers/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/error.h"
#include "model/kernels/autocast_region.h"
#include "model/kernels/cuda_kernels.h"
#include "model/kernels/linear_cross_entropy.h"
#include "model/layers/activation_checkpoint.h"
#include "model/layers/document_attention.h"
#include "model/layers/kv_cache.h"
#include "model/layers/linear.h"

namespace mltrain {
namespace {

// The rotary tables of tokens at [start_pos, start_pos + length): rows of the shared tables, or
// [B, length, head_dim] of each row's own positions in a padded cache.
std::pair<at::Tensor, at::Tensor> rotary_tables(const RotaryImpl& rotary, int64_t start_pos,
                                                int64_t length, const KVCache* padded_cache) {
  if (padded_cache == nullptr)
    return {rotary.cos(start_pos, length), rotary.sin(start_pos, length)};
  const at::Tensor positions = padded_cache->positions(start_pos, length);
  return {rotary.cos_at(positions), rotary.sin_at(positions)};
}

// A generator of its own for the parameter at `index` of a model built under `seed`: splitmix64
// of the pair, so that neighbouring parameters' streams have nothing in common.
at::Generator parameter_generator(uint64_t seed, size_t index) {
  uint64_t mixed = seed + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(index) + 1);
  mixed = (mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9ULL;
  mixed = (mixed ^ (mixed >> 27)) * 0x94D049BB133111EBULL;
  return at::make_generator<at::CPUGeneratorImpl>(mixed ^ (mixed >> 31));
}

// LoRA's parameters, by the names lora.h registers them under.
bool is_adapter(const std::string& name) { return name.find("_lora.") != std::string::npos; }

}  // namespace

BlockImpl::BlockImpl(const ModelConfig& config, Kernels kernels, const WeightOptions& options,
                     const LoraConfig& lora)
    : attn_norm(
          register_module("attn_norm", RMSNorm(config.d_model, config.norm_eps, kernels, options))),
      attn(register_module("attn", Attention(config, kernels, options, lora))),
      ffn_norm(
          register_module("ffn_norm", RMSNorm(config.d_model, config.norm_eps, kernels, options))),
      ffn(register_module("ffn",
                          FeedForward(config.d_model, config.d_ffn, kernels, options, lora))) {}

at::Tensor BlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              int64_t start_pos, KVCache* cache, int64_t layer,
                              const DocumentAttention* documents) {
  const auto [h, normed] = ffn_norm->add_then_forward(
      x, attn(attn_norm(x), cos, sin, start_pos, cache, layer, documents));
  return h + ffn(normed);
}

LlamaImpl::LlamaImpl(const ModelConfig& config, Kernels kernels, Weights weights,
                     c10::Device device, const LoraConfig& lora)
    : token_embeddings(nullptr),
      norm(nullptr),
      rotary(nullptr),
      config_(config),
      kernels_(kernels),
      seed_(at::detail::getDefaultCPUGenerator().current_seed()),
      lora_(lora) {
  config_.validate();
  lora_.validate();
  const WeightOptions options{
      .tensor = at::TensorOptions(at::kFloat)
                    .device(weights == Weights::drawn ? c10::Device(c10::kCPU) : device),
      .bytes = weights == Weights::drawn,
      .drawn = false};
  token_embeddings =
      register_module("token_embeddings", Matrix(config.vocab_size, config.d_model, options));
  auto layer_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layers; ++i) {
    layers.push_back(Block(config, kernels, options, lora));
    layer_list->push_back(layers.back());
  }
  norm = register_module("norm", RMSNorm(config.d_model, config.norm_eps, kernels, options));
  if (!config.tie_word_embeddings)
    lm_head = register_module("lm_head", Matrix(config.vocab_size, config.d_model, options));
  rotary =
      register_module("rotary", Rotary(config.head_dim, config.max_seq_len, config.rope_theta));
  if (lora_.enabled()) {
    for (const auto& item : named_parameters())
      if (!is_adapter(item.key())) item.value().requires_grad_(false);
  }
  if (weights == Weights::drawn) initialize();
}

void LlamaImpl::merge_adapters() {
  const auto merge = [](torch::nn::Module& owner, LowRankAdapter& adapter, const char* name,
                        const at::Tensor& weight) {
    if (!adapter) return;
    adapter->merge_into(weight);
    owner.unregister_module(name);
    adapter = nullptr;
  };
  for (Block& block : layers) {
    merge(*block->attn, block->attn->wqkv_lora, "wqkv_lora", block->attn->wqkv->weight);
    merge(*block->attn, block->attn->wo_lora, "wo_lora", block->attn->wo->weight);
    merge(*block->ffn, block->ffn->w_gate_up_lora, "w_gate_up_lora", block->ffn->w_gate_up->weight);
    merge(*block->ffn, block->ffn->w_down_lora, "w_down_lora", block->ffn->w_down->weight);
  }
  lora_ = {};
}

void LlamaImpl::initialize(const std::vector<at::Tensor>& parameters) {
  at::NoGradGuard no_grad;
  const double std = config_.init_std;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(config_.n_layers));
  const auto wanted = [&](const at::Tensor& parameter) {
    return parameters.empty() ||
           std::any_of(parameters.begin(), parameters.end(), [&](const at::Tensor& given) {
             return given.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl();
           });
  };
  // Each parameter's place among the model's own weights, and LoRA's adapters after them all, so
  // that a weight's values do not depend on which adapters the model has.
  const auto named = named_parameters();
  std::vector<size_t> places(named.size());
  size_t place = 0;
  for (size_t k = 0; k < named.size(); ++k)
    if (!is_adapter(named[k].key())) places[k] = place++;
  for (size_t k = 0; k < named.size(); ++k)
    if (is_adapter(named[k].key())) places[k] = place++;
  for (size_t k = 0; k < named.size(); ++k) {
    const at::Tensor& parameter = named[k].value();
    if (!wanted(parameter)) continue;
    const std::string& name = named[k].key();
    if (name.ends_with("norm.weight")) {
      parameter.fill_(1.0);
      continue;
    }
    if (name.ends_with("_B")) {  // LoRA's B: the adapter adds nothing until it trains
      parameter.zero_();
      continue;
    }
    const bool residual = name.ends_with("attn.wo.weight") || name.ends_with("ffn.w_down.weight");
    // Drawn on the CPU in fp32 whatever the parameter's device: the same values everywhere.
    const bool in_place =
        parameter.is_cpu() && parameter.scalar_type() == at::kFloat && parameter.is_contiguous();
    at::Tensor values = in_place ? parameter : at::empty(parameter.sizes(), at::kFloat);
    const at::Generator generator = parameter_generator(seed_, places[k]);
    if (name.ends_with("_A")) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(parameter.size(1)));
      values.uniform_(-bound, bound, generator);
    } else {
      values.normal_(0.0, residual ? residual_std : std, generator);
    }
    if (!in_place) parameter.copy_(values);
  }
}

at::Tensor LlamaImpl::forward(const at::Tensor& tokens, int64_t start_pos, KVCache* cache) {
  return head(trunk(tokens, start_pos, cache),
              [&](const at::Tensor& normed) { return at::linear(normed, output_weight()); });
}

at::Tensor LlamaImpl::hidden_states(const at::Tensor& tokens, int64_t start_pos, KVCache* cache) {
  return head(trunk(tokens, start_pos, cache), [](const at::Tensor& normed) { return normed; });
}

at::Tensor LlamaImpl::forward_packed(const at::Tensor& tokens, const PackedDocuments& documents) {
  return head(trunk_packed(tokens, documents),
              [&](const at::Tensor& normed) { return at::linear(normed, output_weight()); });
}

at::Tensor LlamaImpl::hidden_states_packed(const at::Tensor& tokens,
                                           const PackedDocuments& documents) {
  return head(trunk_packed(tokens, documents), [](const at::Tensor& normed) { return normed; });
}

at::Tensor LlamaImpl::trunk(const at::Tensor& tokens, int64_t start_pos, KVCache* cache) {
  const int64_t length = tokens.size(1);
  const bool padded = cache != nullptr && cache->padded();
  const int64_t last_position =
      padded ? cache->last_position(start_pos, length) : start_pos + length - 1;
  check_positions(start_pos, last_position - length + 1, last_position);
  const auto [cos, sin] = rotary_tables(*rotary, start_pos, length, padded ? cache : nullptr);
  return run_blocks(tokens, cos, sin, start_pos, cache, nullptr);
}

at::Tensor LlamaImpl::trunk_packed(const at::Tensor& tokens, const PackedDocuments& documents) {
  TORCH_CHECK(documents.positions.sizes() == tokens.sizes(), "documents of positions ",
              documents.positions.sizes(), " do not match tokens ", tokens.sizes());
  // A document may fill the window: its last position is the window's last.
  check_positions(0, 0, tokens.size(1) - 1);
  // The dtype attention will compute in: autocast's, or else the weights'.
  const AutocastSettings autocast = AutocastSettings::now(tokens.device().type());
  const c10::ScalarType dtype = autocast.enabled ? autocast.dtype : output_weight().scalar_type();
  const auto attention =
      std::make_shared<const DocumentAttention>(documents, dtype, config_.head_dim);
  // The rotary rows of each token's own position, [B, T, head_dim]: every layer's tables. The
  // fused rotary takes them in fp32; the ATen one would cast them to the queries' dtype for q and
  // k of every layer, so they are cast here once.
  at::Tensor cos = rotary->cos_at(documents.positions);
  at::Tensor sin = rotary->sin_at(documents.positions);
  if (!runs_fused(kernels_, tokens.device(), dtype)) {
    cos = cos.to(dtype);
    sin = sin.to(dtype);
  }
  return run_blocks(tokens, cos, sin, 0, nullptr, attention);
}

void LlamaImpl::check_positions(int64_t start_pos, int64_t first, int64_t last) const {
  if (start_pos < 0 || last >= config_.max_seq_len) {
    throw UserError(fmt::format(
        "positions {}..{} do not fit model.max_seq_len = {}: shorten the input or raise the key",
        first, last, config_.max_seq_len));
  }
}

at::Tensor LlamaImpl::run_blocks(const at::Tensor& tokens, const at::Tensor& cos,
                                 const at::Tensor& sin, int64_t start_pos, KVCache* cache,
                                 const std::shared_ptr<const DocumentAttention>& documents) {
  at::Tensor h = in_unit(
      0, [&] { return embedding_rows(tokens); }, /*backward_reads_parameters=*/false);
  // Checkpointed, a block keeps only its input for backward, which runs it again: the
  // activations of one block are held at a time instead of those of every layer. Only where there
  // is a backward to feed (grad mode), and never with a cache, which the block appends to.
  const bool recompute =
      activation_checkpointing_ && at::GradMode::is_enabled() && cache == nullptr;
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    Block& block = layers[layer];
    const auto index = static_cast<int64_t>(layer);
    h = in_unit(1 + layer, [&] {
      if (!recompute) return block(h, cos, sin, start_pos, cache, index, documents.get());
      // Called again in backward, after this function has returned: holds the block, the
      // rotary tables (no gradient) and the document attention by value.
      const auto run_block = [block = block.ptr(), cos, sin, start_pos, index,
                              documents](const at::Tensor& x) {
        return block->forward(x, cos, sin, start_pos, nullptr, index, documents.get());
      };
      return checkpointed(run_block, h, block->parameters());
    });
  }
  return h;
}

// Under autocast the residual stream is fp32, as the weights are kept. A table gathered in bf16
// (ZeRO-3, dist/unit_shards.h) gives its rows cast up; on the CPU it is looked up cast to fp32
// first, as the CPU's embedding backward adds a token's gradients up in the table's dtype, where
// bf16 loses them (4,096 gradients of 0.01 add up to 4), and CUDA's adds them in fp32.
at::Tensor LlamaImpl::embedding_rows(const at::Tensor& tokens) {
  const at::Tensor& table = token_embeddings->weight;
  const bool autocast = AutocastSettings::now(tokens.device().type()).enabled;
  if (!autocast || table.scalar_type() == at::kFloat) return at::embedding(table, tokens);
  if (tokens.device().is_cpu()) return at::embedding(table.to(at::kFloat), tokens);
  return at::embedding(table, tokens).to(at::kFloat);
}

at::Tensor LlamaImpl::head(const at::Tensor& h,
                           const std::function<at::Tensor(const at::Tensor&)>& project) {
  return in_unit(layers.size() + 1, [&] { return project(norm(h)); });
}

at::Tensor LlamaImpl::in_unit(size_t position, const std::function<at::Tensor()>& run,
                              bool backward_reads_parameters) {
  if (!unit_hooks_) return run();
  unit_hooks_->before_forward(position);
  return unit_hooks_->after_forward(position, run(), backward_reads_parameters);
}

UnitParameters LlamaImpl::unit_parameters() const {
  UnitParameters units = {{token_embeddings->weight}};
  for (const Block& block : layers) units.push_back(block->parameters());
  units.push_back({norm->weight, output_weight()});
  return units;
}

at::Tensor LlamaImpl::loss(const at::Tensor& tokens, const at::Tensor& targets,
                           const PackedDocuments* documents, const at::Tensor& target_weights) {
  const at::Tensor row_weights = target_weights.defined() ? target_weights.flatten() : at::Tensor();
  const at::Tensor h =
      documents != nullptr ? trunk_packed(tokens, *documents) : trunk(tokens, 0, nullptr);
  return head(h, [&](const at::Tensor& normed) {
    if (kernels_ == Kernels::fused_cpu && normed.device().is_cpu()) {
      return linear_cross_entropy(normed.flatten(0, 1), output_weight(), targets.flatten(),
                                  row_weights);
    }
    const at::Tensor logits = at::linear(normed, output_weight());
    // The fused CUDA loss takes the mean only: a weighted one goes the plain way.
    if (runs_fused_cuda(kernels_, logits) && !row_weights.defined()) {
      return cuda_cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                /*gradient_overwrites_logits=*/true);
    }
    return next_token_loss(logits, targets, target_weights);
  });
}

const at::Tensor& LlamaImpl::output_weight() const {
  return lm_head ? lm_head->weight : token_embeddings->weight;
}

int64_t LlamaImpl::num_parameters() const {
  int64_t total = 0;
  for (const at::Tensor& parameter : parameters()) total += parameter.numel();
  return total;
}

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& targets,
                           const at::Tensor& target_weights) {
  const at::Tensor flat_logits = logits.flatten(0, 1).to(at::kFloat);
  if (!target_weights.defined()) return at::cross_entropy_loss(flat_logits, targets.flatten());
  return at::cross_entropy_loss(flat_logits, targets.flatten(), {}, at::Reduction::None)
      .mul(target_weights.flatten())
      .sum();
}

double training_flops_per_token(const ModelConfig& config, int64_t num_parameters,
                                int64_t seq_len) {
  const double dense = 6.0 * static_cast<double>(num_parameters);
  const double attention =
      12.0 * static_cast<double>(config.n_layers * config.n_q_heads * config.head_dim * seq_len);
  return dense + attention;
}

}  // namespace mltrain
