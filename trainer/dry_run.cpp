#include "trainer/dry_run.h"

#include <spdlog/spdlog.h>
#include <torch/version.h>

#include "model/llama.h"
#include "trainer/compute_settings.h"
#include "trainer/device.h"
#include "trainer/model_summary.h"
#include "trainer/precision.h"

namespace mltrain {

void dry_run(const Config& config) {
  apply_compute_settings(config.train);
  const c10::Device device = resolve_device(config.train.device);
  spdlog::info("mltrain {} on LibTorch {}, device {}", MLTRAIN_VERSION, TORCH_VERSION,
               describe_device(device));
  log_precision(precision_on_this_machine(config.train.precision, device));

  Llama model(config.model);
  model->to(device);
  spdlog::info("parameters:\n{}", parameter_table(model));

  const int64_t seq_len = config.data.seq_len;
  const double flops = training_flops_per_token(config.model, model->num_parameters(), seq_len);
  spdlog::info(
      "training FLOPs per token: {:.2f} MFLOP = 6 N + 12 n_layers n_q_heads head_dim "
      "seq_len (N = {}, seq_len = {})",
      flops / 1e6, model->num_parameters(), seq_len);
  const int64_t tokens = config.data.micro_batch * config.data.grad_accum * seq_len;
  spdlog::info(
      "tokens per optimizer step and rank: {} = micro_batch {} x grad_accum {} x seq_len {}",
      tokens, config.data.micro_batch, config.data.grad_accum, seq_len);
  spdlog::info("dry run: the config is valid and the model builds; nothing was trained");
}

}  // namespace mltrain
