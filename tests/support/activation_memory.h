#pragma once

// What one micro-batch's forward pass leaves held for backward, measured by the device's own
// allocator, for holding the memory plan's activation counts (trainer/run/memory_plan.h) to what
// the model's autograd graph keeps: on the CPU (tests/trainer/memory_plan_test.cpp) and on CUDA
// (tests/gpu/memory_plan_cuda_test.cpp).
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "model/kernels/kernels.h"
#include "model/layers/model_config.h"

namespace mltrain::testing {

// A model with the base model's proportions at a size a unit test can run.
ModelConfig small_base();

// The bytes that the loss of one micro-batch of random tokens [batch, length] and its graph hold
// after forward, on `device`, under bf16 autocast where asked (the weights' casts it caches count
// too); with `document_start`, of its packed documents (data.document_masking) too. The CPU's are
// the bytes allocated while it runs and not freed (CpuAllocationCounter); CUDA's, the
// caching allocator's allocated bytes after against before.
int64_t measured_activations(const ModelConfig& config, Kernels kernels, int64_t batch,
                             int64_t length, bool bf16, bool checkpointing,
                             std::optional<int64_t> document_start = std::nullopt,
                             c10::Device device = c10::kCPU);

}  // namespace mltrain::testing
