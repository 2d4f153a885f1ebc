#pragma once

#include <filesystem>
#include <functional>

#include "trainer/config/config.h"

namespace mltrain {

// Writes the weights that `weights` names (find_weights: a run directory's newest checkpoint, a
// checkpoint directory or a .safetensors file, verified) as the Hugging Face LlamaForCausalLM
// directory `out_dir`, which AutoModelForCausalLM.from_pretrained loads without custom code:
// model.safetensors (Hugging Face names, fp32; no lm_head.weight when tied), config.json and
// generation_config.json (hf_config.h) and, when the run has a tokenizer (the checkpoint's copy, or
// else the config's data.tokenizer), its Hugging Face files (write_hf_tokenizer), whose bos and
// eos ids the configs name.
//
// An existing `out_dir` other than an empty directory is a UserError before anything is written.
// The files go into a temporary sibling directory that is renamed to `out_dir` once complete, so
// a failure leaves neither behind. `after_weights`, when set, runs on that temporary directory once
// model.safetensors is in it (the tests' seam for a failure midway). A single-process operation.
void export_hf(const Config& config, const std::filesystem::path& weights,
               const std::filesystem::path& out_dir,
               const std::function<void(const std::filesystem::path&)>& after_weights = {});

}  // namespace mltrain
