#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/kernels/kernels.h"
#include "model/layers/attention.h"
#include "model/layers/feed_forward.h"
#include "model/layers/linear.h"
#include "model/layers/lora_config.h"
#include "model/layers/model_config.h"
#include "model/layers/rms_norm.h"
#include "model/layers/rotary.h"
#include "model/layers/unit_hooks.h"

namespace mltrain {

class DocumentAttention;
class KVCache;
struct PackedDocuments;

// Pre-norm decoder block: h = x + attn(attn_norm(x)), then h + ffn(ffn_norm(h)). The first add is
// folded into ffn_norm (RMSNormImpl::add_then_forward); the second is the next block's input, which
// checkpointing keeps.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config, Kernels kernels, const WeightOptions& options = {},
            const LoraConfig& lora = {});
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t start_pos, KVCache* cache, int64_t layer,
                     const DocumentAttention* documents = nullptr);

  RMSNorm attn_norm;
  Attention attn;
  RMSNorm ffn_norm;
  FeedForward ffn;
};
TORCH_MODULE(Block);

// The LLaMA decoder: token embeddings, n_layers blocks, a final norm and the output projection.
// With tie_word_embeddings the output projection is the embedding matrix itself: one tensor,
// registered once (as token_embeddings.weight), so parameters() lists it once and an optimizer
// steps it once. Submodule names follow the model chapter, but for the fused projections (wqkv,
// w_gate_up); hf_state_dict.h maps them to Hugging Face's.
class LlamaImpl : public torch::nn::Module {
 public:
  // Whether the weights are made drawn (on the CPU in fp32: initialize()), or with no bytes at
  // all, on the device given, for ZeRO-3, which gives each unit bytes there and draws or loads its
  // weights in turn (dist/unit_shards.h), so that no rank ever holds the whole model. The rotary
  // tables are made on the CPU either way.
  enum class Weights { drawn, none };

  // `kernels`: the implementation every layer and the loss run (kernels.h). The initial weights
  // are those of the seed the global CPU generator was last given (at::manual_seed). With `lora`
  // on, the projections it targets get adapters (lora.h), which alone train: every other weight
  // is frozen (requires no gradient).
  LlamaImpl(const ModelConfig& config, Kernels kernels, Weights weights = Weights::drawn,
            c10::Device device = c10::kCPU, const LoraConfig& lora = {});

  // tokens [B, T] (int64) at positions [start_pos, start_pos + T) -> logits [B, T, vocab_size].
  // With a cache, every layer appends its keys and values and attends over the cached prefix; with
  // a padded one (kv_cache.h), start_pos counts the cache's slots and each row has its own
  // positions.
  at::Tensor forward(const at::Tensor& tokens, int64_t start_pos = 0, KVCache* cache = nullptr);

  // The same up to the output projection: the final norm's output [B, T, d_model].
  at::Tensor hidden_states(const at::Tensor& tokens, int64_t start_pos = 0,
                           KVCache* cache = nullptr);

  // The same for tokens [B, T] packed with `documents` (packed_documents.h, on the tokens'
  // device): each document at its own positions from 0, attending within itself only, as if it
  // were alone.
  at::Tensor forward_packed(const at::Tensor& tokens, const PackedDocuments& documents);
  at::Tensor hidden_states_packed(const at::Tensor& tokens, const PackedDocuments& documents);

  // The training loss: mean next-token cross-entropy of tokens [B, T] against targets [B, T]
  // (the next tokens), a 0-dim fp32 tensor, with attention within `documents` when given. With
  // Kernels::fused_cpu on the CPU it goes through the output projection in chunks
  // (linear_cross_entropy.h) and never holds the [B, T, V] logits; with Kernels::fused_cuda it is
  // cuda_cross_entropy of the logits in their dtype; otherwise next_token_loss of the logits.
  // With `target_weights` [B, T] (fp32, on the tokens' device), the sum of each target's loss
  // times its weight instead of the mean: a masked loss, whose weights are 0 where a token is no
  // target (loss masks) and where it is, one over the targets the loss is the mean of.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets,
                  const PackedDocuments* documents = nullptr,
                  const at::Tensor& target_weights = {});

  // Draws the initial values of those of `parameters` that are the model's (all of them when
  // empty): normal(0, init_std) for embeddings and projections, init_std / sqrt(2 n_layers) for
  // the projections that write into the residual stream (wo, w_down), ones for the norms; LoRA's
  // A uniform within 1 / sqrt(its columns), its B zeros. Each parameter has a CPU generator of
  // its own, seeded from the model's seed and the parameter's place in parameters() (LoRA's
  // adapters counted after every weight), so that a parameter's values are the same whichever
  // others are drawn with it, in any order, on any device (ZeRO-3 draws one unit at a time), and
  // with adapters or without.
  void initialize(const std::vector<at::Tensor>& parameters = {});

  // Whether training recomputes each block's activations in backward instead of keeping them from
  // the forward pass (activation_checkpoint.h): the activations of one block are held at a time
  // rather than those of all n_layers, for one more forward pass of the blocks in each backward.
  // Off by default. It changes how the model is trained, not what it computes, so it is a switch
  // here rather than a key of ModelConfig.
  void set_activation_checkpointing(bool enabled) { activation_checkpointing_ = enabled; }
  bool activation_checkpointing() const { return activation_checkpointing_; }

  // The units sharding runs the model in (unit_hooks.h): the embedding, each block, and the head
  // (the final norm and the output projection), with the parameters each reads.
  UnitParameters unit_parameters() const;
  // The hooks every forward calls around each unit from now on; none (the default) runs the
  // model without.
  void set_unit_hooks(std::shared_ptr<UnitHooks> hooks) { unit_hooks_ = std::move(hooks); }
  bool has_unit_hooks() const { return unit_hooks_ != nullptr; }

  // With LoRA: each adapter merged into the weight it adapts (W += scale · B A) and removed, so
  // that the model computes what it did with them and is a plain model again (what --export-hf
  // writes). Nothing without.
  void merge_adapters();
  bool has_adapters() const { return lora_.enabled(); }

  const ModelConfig& config() const { return config_; }
  Kernels kernels() const { return kernels_; }
  int64_t num_parameters() const;
  const at::Tensor& output_weight() const;

  Matrix token_embeddings;  // [vocab_size, d_model]
  std::vector<Block> layers;
  RMSNorm norm;
  Matrix lm_head{nullptr};  // only when the embeddings are not tied
  Rotary rotary;

 private:
  // A UserError unless start_pos >= 0 and positions first..last fit model.max_seq_len.
  void check_positions(int64_t start_pos, int64_t first, int64_t last) const;

  // The embedding and the blocks over tokens at [start_pos, start_pos + T), or packed with
  // documents: the final norm's input.
  at::Tensor trunk(const at::Tensor& tokens, int64_t start_pos, KVCache* cache);
  at::Tensor trunk_packed(const at::Tensor& tokens, const PackedDocuments& documents);

  // The embedded tokens through the blocks, at the positions the tables give.
  at::Tensor run_blocks(const at::Tensor& tokens, const at::Tensor& cos, const at::Tensor& sin,
                        int64_t start_pos, KVCache* cache,
                        const std::shared_ptr<const DocumentAttention>& documents);

  // The embedding's rows of `tokens`, fp32 under autocast whatever the table's dtype.
  at::Tensor embedding_rows(const at::Tensor& tokens);

  // The head unit: `project` of the final norm of the trunk's output h.
  at::Tensor head(const at::Tensor& h, const std::function<at::Tensor(const at::Tensor&)>& project);

  // run(), as unit `position`, between the unit hooks when there are any.
  at::Tensor in_unit(size_t position, const std::function<at::Tensor()>& run,
                     bool backward_reads_parameters = true);

  ModelConfig config_;
  Kernels kernels_;
  uint64_t seed_;  // the global CPU generator's when the model was built
  LoraConfig lora_;
  bool activation_checkpointing_ = false;
  std::shared_ptr<UnitHooks> unit_hooks_;
};
TORCH_MODULE(Llama);

// Mean cross-entropy of logits [B, T, V] against targets [B, T] that are already the next tokens,
// computed in fp32 whatever the logits' dtype; with target_weights [B, T], the weighted sum.
at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& targets,
                           const at::Tensor& target_weights = {});

// Training FLOPs per token, forward and backward, as in the PaLM paper (appendix B):
// 6 N + 12 n_layers n_q_heads head_dim seq_len, where N counts every parameter (the tied
// embedding once: its lookup is free but the output projection is a matmul over it) and the second
// term is the attention scores and weighted sum, 6 x 2 n_q_heads head_dim seq_len per layer.
double training_flops_per_token(const ModelConfig& config, int64_t num_parameters, int64_t seq_len);

}  // namespace mltrain
