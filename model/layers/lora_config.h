#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/layers/model_config.h"

namespace mltrain {

// The keys of the config's `lora:` section (as MLTRAIN_MODEL_KEYS): low-rank adapters (LoRA, Hu et
// al. 2021) that train in place of the model's weights, which stay frozen.
#define MLTRAIN_LORA_KEYS(KEY, S)                                                                 \
  KEY(S, int64_t, rank, 0,                                                                        \
      "rank of the low-rank adapters that train in place of the frozen weights (LoRA); 0: none, " \
      "every weight trains",                                                                      \
      at_least(0))                                                                                \
  KEY(S, double, alpha, 16.0, "scale of the adapters: each adds alpha / rank times B A x",        \
      at_least(0))                                                                                \
  KEY(S, std::string, targets, "q,k,v,o,gate,up,down",                                            \
      "the projections that get adapters, comma-separated: q, k, v, o (attention), gate, up, "    \
      "down (feed-forward)",                                                                      \
      {})

// The projections LoRA may adapt, as lora.targets names them.
inline const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q", "k", "v", "o", "gate", "up", "down"};
  return names;
}

struct LoraConfig {
  MLTRAIN_LORA_KEYS(MLTRAIN_CONFIG_FIELD, lora)

  bool enabled() const { return rank > 0; }
  // alpha / rank: what each adapter's product is scaled by.
  double scale() const { return alpha / static_cast<double>(rank); }
  // The targets, in lora_target_names()' order, each once.
  std::vector<std::string> target_list() const;
  bool adapts(const std::string& name) const;
  // Throws UserError naming `lora.targets` for a name that is not a projection, or none at all.
  void validate() const;
  // The adapters' parameters in a model of `model`'s shape: rank × (columns + rows) of each
  // target of each block; 0 with LoRA off.
  int64_t parameters(const ModelConfig& model) const;
};

}  // namespace mltrain
