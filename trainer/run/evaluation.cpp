#include "trainer/run/evaluation.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "common/error.h"
#include "data/loader.h"
#include "model/interop/hf_checkpoint.h"
#include "model/interop/hf_state_dict.h"
#include "model/kernels/autocast_region.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "trainer/checkpoint/checkpoint_store.h"
#include "trainer/machine/compute_settings.h"
#include "trainer/machine/device.h"
#include "trainer/machine/precision.h"
#include "trainer/report/metrics_log.h"
#include "trainer/run/run_data.h"
#include "trainer/run/train_step.h"

namespace mltrain {

Evaluation evaluate(Llama& model, const TokenWindows& windows, const BatchLayout& layout,
                    int64_t eval_batches, c10::Device device, bool bf16, Communicator& communicator,
                    std::optional<int64_t> document_start) {
  at::NoGradGuard no_grad;
  // Under ZeRO-3 (unit hooks) each unit's weights are gathered as the model runs it and freed
  // after: a cache of their bf16 casts would hold the whole model again, and a rank that skipped a
  // batch would leave the others waiting in its gathers. So there nothing is cached (under bf16 the
  // units are gathered in bf16, and nothing is cast), and a rank past the last window runs the
  // batch all the same, on the first window, uncounted.
  const bool sharded_weights = model->has_unit_hooks();
  std::optional<WeightCastCache> casts;  // under bf16 autocast, one cast for every batch
  if (!sharded_weights) casts.emplace();
  model->eval();
  double loss_sum = 0.0;
  int64_t tokens = 0;
  const int64_t batches = validation_batches(windows.num_windows(), layout, eval_batches);
  for (int64_t batch = 0; batch < batches; ++batch) {
    std::vector<int64_t> indices =
        validation_windows(windows.num_windows(), layout, batch, communicator.rank());
    const bool counted = !indices.empty();
    if (!counted && !sharded_weights) continue;
    if (!counted) indices = {0};
    const at::Tensor host_window = gather_windows(windows, indices);
    const at::Tensor window = host_window.to(device);
    const std::optional<PackedDocuments> documents =
        documents_of(host_window, document_start, device);
    // With loss masks each batch's loss is summed over the targets that count (their flags as
    // weights), and those are what the mean divides by; without, it is the batch's mean.
    at::Tensor target_weights;
    int64_t batch_tokens = window.size(0) * (window.size(1) - 1);
    if (windows.has_loss_masks()) {
      const at::Tensor targets = gather_targets(windows, indices).to(at::kFloat);
      target_weights = targets.to(device);
      batch_tokens = static_cast<int64_t>(targets.sum().item<double>());
    }
    const at::Tensor loss = window_loss(model, window, device, bf16, documents, target_weights);
    if (!counted) continue;
    const double summed = target_weights.defined() ? 1.0 : static_cast<double>(batch_tokens);
    loss_sum += loss.item<double>() * summed;
    tokens += batch_tokens;
  }
  model->train();
  const double all_tokens = communicator.all_reduce_sum(static_cast<double>(tokens));
  if (all_tokens == 0) {
    throw UserError(
        "the validation windows hold no target that counts (their loss masks are all 0): there "
        "is nothing to evaluate; prepare the corpus with conversations that have answers");
  }
  const double loss = communicator.all_reduce_sum(loss_sum) / all_tokens;
  return {loss, std::exp(loss), static_cast<int64_t>(all_tokens)};
}

SourcesEvaluation evaluate_sources(Llama& model, const std::vector<RunSource>& sources,
                                   const BatchLayout& layout, int64_t eval_batches,
                                   c10::Device device, bool bf16, Communicator& communicator,
                                   std::optional<int64_t> document_start) {
  SourcesEvaluation result;
  const std::vector<double> shares = shares_of(sources);
  double loss = 0.0;
  int64_t tokens = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    const Evaluation evaluation = evaluate(model, sources[s].val, layout, eval_batches, device,
                                           bf16, communicator, document_start);
    loss += shares[s] * evaluation.loss;
    tokens += evaluation.tokens;
    if (!sources[s].name.empty()) result.by_source.emplace_back(sources[s].name, evaluation);
  }
  result.mean = {loss, std::exp(loss), tokens};
  return result;
}

std::string SourcesEvaluation::by_source_text() const {
  std::string text;
  for (const auto& [name, evaluation] : by_source)
    text += fmt::format("{}{} {:.4f}", text.empty() ? " | " : ", ", name, evaluation.loss);
  return text;
}

nlohmann::json SourcesEvaluation::by_source_json() const {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [name, evaluation] : by_source) json["val_loss/" + name] = evaluation.loss;
  return json;
}

Evaluation evaluate_weights(const Config& run_config, const std::filesystem::path& weights) {
  // A Hugging Face directory is checked against the config by its config.json; mltrain's
  // checkpoints by their checksums.
  const bool hf_directory = is_hf_model_directory(weights);
  const std::filesystem::path file = hf_directory ? weights : find_weights(weights);
  Config config = run_config;
  if (!hf_directory) config.data.tokenizer = tokenizer_for(file, run_config);
  apply_compute_settings(config.train);
  check_tokenizer(config);
  const c10::Device device = resolve_device(config.train.device);
  const bool bf16 = use_bf16_autocast(config.train.precision, device);
  const std::optional<int64_t> starts_documents = document_start(config);
  const std::vector<RunSource> sources = open_sources(config, /*train=*/false);
  // The weights are held against the config before a model of it is built.
  if (hf_directory) {
    check_hf_model_config(config.model, file);
  } else {
    check_weights_can_fill(config.model, "the config's model.* keys", file);
  }
  Llama model(config.model, choose_kernels(config.train.kernels, device), LlamaImpl::Weights::drawn,
              c10::kCPU, hf_directory ? config.lora : checkpoint_lora(file, config));
  if (hf_directory) {
    load_hf_model(model, file);
  } else {
    load_model_weights(model, file);
  }
  model->merge_adapters();  // a LoRA run's adapters, once, rather than in every product
  model->to(device);
  const auto single_rank = make_communicator(World());
  const SourcesEvaluation evaluated =
      evaluate_sources(model, sources, {config.data.micro_batch, config.data.grad_accum, 1},
                       config.train.eval_batches, device, bf16, *single_rank, starts_documents);
  const Evaluation& evaluation = evaluated.mean;
  spdlog::info("{}: val loss {:.6f} | val ppl {:.2f} | {} tokens{}", file.string(), evaluation.loss,
               evaluation.perplexity, evaluation.tokens, evaluated.by_source_text());
  // The record goes to the run that saved the checkpoint, wherever it now is, and only there:
  // weights of no run (a Hugging Face directory) leave every run directory as it was.
  const std::optional<std::filesystem::path> run_dir =
      hf_directory ? std::nullopt : run_directory_of(file);
  if (run_dir) {
    const std::filesystem::path metrics = *run_dir / "metrics.jsonl";
    // The evaluation is done and reported: a run directory it may not write (read-only, say) only
    // keeps it out of the record.
    try {
      nlohmann::json record = {{"event", "eval_only"},
                               {"weights", file.string()},
                               {"val_loss", evaluation.loss},
                               {"val_ppl", evaluation.perplexity}};
      record.update(evaluated.by_source_json());
      MetricsLog(metrics).write(record);
    } catch (const std::exception& error) {
      spdlog::warn("the evaluation is not recorded in {}: {}", metrics.string(), error.what());
    }
  }
  return evaluation;
}

}  // namespace mltrain
