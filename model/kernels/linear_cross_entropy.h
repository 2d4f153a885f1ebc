#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mltrain {

// Mean cross-entropy of the logits hidden @ weight^T against targets, without ever holding all
// the logits: hidden [N, d], weight [V, d], targets [N] (int64, every row counts) -> a 0-dim fp32
// tensor, equal to at::cross_entropy_loss(at::linear(hidden, weight), targets) up to rounding.
// The rows go through the projection a chunk at a time; when a gradient is wanted, each chunk's
// gradient is computed right there in the forward pass (the same matmuls the plain backward does)
// and backward only scales it. Under autocast the matmuls run in the autocast dtype as at::linear
// would; the softmax is always fp32. For a given input and thread count the result is bitwise
// reproducible: the chunking and the order of accumulation are fixed.
//
// With `row_weights` [N] (fp32, no gradient), the weighted sum of the rows' losses instead of
// their mean: a masked loss (loss masks) gives the rows that are no target a weight of 0.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& targets, const at::Tensor& row_weights = {});

// The same with chunks of chunk_rows rows, for tests that need several chunks of a small problem.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& targets, int64_t chunk_rows,
                                const at::Tensor& row_weights = {});

// The rows per chunk linear_cross_entropy takes for a vocabulary of vocab_size.
int64_t linear_cross_entropy_chunk_rows(int64_t vocab_size);

}  // namespace mltrain
