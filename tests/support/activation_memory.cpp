#include "tests/support/activation_memory.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "model/kernels/autocast_region.h"
#include "model/layers/llama.h"
#include "model/layers/packed_documents.h"
#include "trainer/machine/cpu_allocation_counter.h"

namespace mltrain::testing {
namespace {

int64_t cuda_allocated_bytes(c10::Device device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

}  // namespace

ModelConfig small_base() {
  ModelConfig model;
  model.vocab_size = 256;
  model.d_model = 128;
  model.n_layers = 4;
  model.n_q_heads = 4;
  model.n_kv_heads = 2;
  model.head_dim = 16;
  model.d_ffn = 352;
  model.max_seq_len = 128;
  return model;
}

int64_t measured_activations(const ModelConfig& config, Kernels kernels, int64_t batch,
                             int64_t length, bool bf16, bool checkpointing,
                             std::optional<int64_t> document_start, c10::Device device) {
  at::manual_seed(0);
  Llama model(config, kernels);
  model->to(device);
  model->set_activation_checkpointing(checkpointing);
  const at::Tensor tokens = at::randint(config.vocab_size, {batch, length + 1},
                                        at::TensorOptions(device).dtype(at::kLong));
  const at::Tensor inputs = tokens.narrow(1, 0, length).contiguous();
  const at::Tensor targets = tokens.narrow(1, 1, length).contiguous();
  std::optional<CpuAllocationCounter> cpu_counter;
  int64_t cuda_before = 0;
  if (device.is_cuda()) {
    cuda_before = cuda_allocated_bytes(device);
  } else {
    cpu_counter.emplace();
  }
  std::optional<PackedDocuments> documents;
  if (document_start) documents = pack_documents(inputs, *document_start);
  // Inside the autocast region: the weights' casts it caches count too.
  const AutocastGuard autocast(device, bf16);
  const at::Tensor loss = model->loss(inputs, targets, documents ? &*documents : nullptr);
  return device.is_cuda() ? cuda_allocated_bytes(device) - cuda_before
                          : cpu_counter->allocated_bytes();
}

}  // namespace mltrain::testing
