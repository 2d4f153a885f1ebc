#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace mltrain {

// Windows read as the documents packed into them (data.document_masking). A corpus is a stream of
// documents each followed by the end-of-document token. The model reads that token as the start of
// the next document, as mlgen puts it before a prompt: a document begins at each end-of-document
// token, which is its first token, and at a row's first token (the tail of a document that began
// before the window). Positions count from 0 at each document's beginning, and attention stays
// within each document (document_attention.h).
struct PackedDocuments {
  at::Tensor positions;  // [B, T] int64: each token's position within its document
  // [documents + 1] int32: where each document begins in the B x T tokens taken row after row,
  // then B x T; the cumulative lengths that variable-length attention takes.
  at::Tensor bounds;
  int64_t longest = 0;  // tokens of the longest document

  // The same on `device`; copies that do not wait for the device when the tensors are pinned.
  PackedDocuments to(c10::Device device) const;
};

// The documents of tokens [B, T] (int64, on the CPU) that begin at each `document_start` token and
// at each row's first token. With pin_memory the tensors are page-locked, so that to(cuda) need
// not wait for the device's queue.
PackedDocuments pack_documents(const at::Tensor& tokens, int64_t document_start,
                               bool pin_memory = false);

}  // namespace mltrain
