#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "model/layers/packed_documents.h"

namespace mltrain {

// Causal attention within the documents of packed windows (packed_documents.h): each query sees the
// keys of its own document up to itself. Built once per forward pass and used by every layer, so
// that a mask is built once, not per layer. On:
// - CUDA in fp16/bf16 with head_dim a multiple of 8 up to 256: variable-length flash attention
//   over the B x T tokens as one sequence of documents, computing only each document's own tiles.
//   Flash attention needs an Ampere or newer GPU.
// - the CPU: ATen's flash kernel, causal (it skips the tiles above the diagonal), with an additive
//   mask, -inf across documents, over the tiles it computes: near plain causal attention's speed
//   (bench/document_masking.sh), where SDPA with the mask alone computes every tile.
// - CUDA otherwise (fp32): SDPA with the same additive mask (the memory-efficient kernel).
class DocumentAttention {
 public:
  // `documents` on the device the attention runs on; `dtype`: the queries', keys' and values'
  // (the autocast dtype under autocast), which the mask is built in.
  DocumentAttention(PackedDocuments documents, c10::ScalarType dtype, int64_t head_dim);

  // Queries [B, Hq, T, D] over keys and values [B, Hkv, T, D], Hkv dividing Hq (grouped heads), of
  // the dtype given at construction. Returns [B, Hq, T, D], as SDPA does.
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;

 private:
  PackedDocuments documents_;
  // [B, 1, T, T] additive, in the attention's dtype; none for variable-length flash attention,
  // which takes the documents' bounds instead.
  at::Tensor mask_;
};

// Whether attention within documents runs variable-length flash attention (no mask) for queries of
// `dtype` on `device`; the memory plan counts the mask where it does not.
bool runs_variable_length_flash(c10::DeviceType device, c10::ScalarType dtype, int64_t head_dim);

}  // namespace mltrain
