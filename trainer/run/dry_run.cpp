#include "trainer/run/dry_run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>

#include "common/error.h"
#include "model/layers/llama.h"
#include "trainer/machine/compute_settings.h"
#include "trainer/machine/device.h"
#include "trainer/machine/precision.h"
#include "trainer/report/model_summary.h"
#include "trainer/run/memory_plan.h"

namespace mltrain {
namespace {

// The plan; where it does not fit, what would make it fit, returned for the dry run's verdict.
std::string report(const MemoryPlan& plan, const Config& config) {
  spdlog::info("{}", describe(plan));
  if (const std::string stages = describe_stages(config, plan.target); !stages.empty())
    spdlog::info("{}", stages);
  return memory_shortfall(plan, config);
}

// The dry run's exit: the one a run of this config would reach first. A plan that does not fit is
// refused as the run would refuse it (exit 2), once everything else has been reported, so that a
// script can tell it from a config that would run.
void refuse_if_short(const std::string& shortfall, const Config& config) {
  if (shortfall.empty()) return;
  if (!config.train.check_memory) {
    spdlog::warn("{}; train.check_memory=false starts the run all the same", shortfall);
    return;
  }
  throw UserError(fmt::format(
      "dry run: {}; a run of this config would stop here (train.check_memory=false starts it "
      "all the same)",
      shortfall));
}

}  // namespace

void dry_run(const Config& config, const World& world, const DryRunTarget& target) {
  apply_compute_settings(config.train);
  const int ranks = target.ranks > 0 ? target.ranks : world.size;
  if (target.device_memory_gb > 0) {
    const PrecisionChoice precision =
        choose_precision(config.train.precision, c10::Device(c10::kCUDA), CpuBf16::emulated);
    const MemoryPlan plan = plan_memory(config, {.ranks = ranks,
                                                 .cuda = true,
                                                 .bf16 = precision.bf16,
                                                 .device_memory = target.device_memory_gb * 1e9});
    const std::string shortfall = report(plan, config);
    spdlog::info("dry run: the config is valid; planned for {} GPUs of {} GB, nothing was built",
                 ranks, target.device_memory_gb);
    refuse_if_short(shortfall, config);
    return;
  }
  const c10::Device device = resolve_device(config.train.device);
  spdlog::info("mltrain {} on LibTorch {}, device {}", MLTRAIN_VERSION, TORCH_VERSION,
               describe_device(device));
  const PrecisionChoice precision = precision_on_this_machine(config.train.precision, device);
  log_precision(precision);
  const int ranks_on_node = target.ranks > 0 ? ranks : world.local_size;
  const MemoryPlan plan = plan_memory(
      config, {.ranks = ranks,
               .cuda = device.is_cuda(),
               .bf16 = precision.bf16,
               .device_memory = static_cast<double>(memory_per_rank(device, ranks_on_node))});
  const std::string shortfall = report(plan, config);

  // The model is built to show its parameters, where its weights alone fit this machine: without
  // bytes (their shapes are what the table shows), so that a model sharded by ZeRO-3, whose plan
  // counts a rank's part, is not made whole here.
  const double model_bytes = plan.runtime + plan.weights;
  const bool built = !plan.target.device_memory || model_bytes <= *plan.target.device_memory;
  if (built) {
    Llama model(config.model, choose_kernels(config.train.kernels, device),
                LlamaImpl::Weights::none, device, config.lora);
    model->to(device);
    spdlog::info("parameters:\n{}", parameter_table(model));
  } else {
    spdlog::warn("the model is not built: its weights alone take {:.2f} GB of the {:.2f} GB here",
                 model_bytes / 1e9, *plan.target.device_memory / 1e9);
  }

  const int64_t seq_len = config.data.seq_len;
  const int64_t parameters = config.model.parameters();
  const double flops = training_flops_per_token(config.model, parameters, seq_len);
  spdlog::info(
      "training FLOPs per token: {:.2f} MFLOP = 6 N + 12 n_layers n_q_heads head_dim "
      "seq_len (N = {}, seq_len = {})",
      flops / 1e6, parameters, seq_len);
  const int64_t tokens = config.data.micro_batch * config.data.grad_accum * seq_len;
  spdlog::info(
      "tokens per optimizer step and rank: {} = micro_batch {} x grad_accum {} x seq_len {}",
      tokens, config.data.micro_batch, config.data.grad_accum, seq_len);
  spdlog::info("dry run: the config is valid{}; nothing was trained",
               built ? " and the model builds" : "");
  refuse_if_short(shortfall, config);
}

}  // namespace mltrain
