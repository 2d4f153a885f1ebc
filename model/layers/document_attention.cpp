#include "model/layers/document_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>
#include <utility>

#include "model/layers/attention.h"

namespace mltrain {

bool runs_variable_length_flash(c10::DeviceType device, c10::ScalarType dtype, int64_t head_dim) {
  const bool half_precision = dtype == at::kHalf || dtype == at::kBFloat16;
  return device == c10::kCUDA && half_precision && head_dim % 8 == 0 && head_dim <= 256;
}

DocumentAttention::DocumentAttention(PackedDocuments documents, c10::ScalarType dtype,
                                     int64_t head_dim)
    : documents_(std::move(documents)) {
  if (runs_variable_length_flash(documents_.positions.device().type(), dtype, head_dim)) return;
  // Each token's document within its row, counted from its first token. A key is hidden from a
  // query of another document, and from an earlier one: SDPA takes a mask or is_causal, not both.
  const at::Tensor document = at::cumsum(documents_.positions == 0, 1);  // [B, T]
  const int64_t length = document.size(1);
  const at::Tensor future = at::ones({length, length}, document.options().dtype(at::kBool)).triu(1);
  const at::Tensor hidden = (document.unsqueeze(2) != document.unsqueeze(1)) | future;
  mask_ = at::zeros(hidden.sizes(), documents_.positions.options().dtype(dtype))
              .masked_fill_(hidden, -std::numeric_limits<double>::infinity())
              .unsqueeze(1);
}

at::Tensor DocumentAttention::operator()(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v) const {
  if (!mask_.defined()) {
    const int64_t batch = q.size(0);
    const int64_t length = q.size(2);
    // [B, H, T, D] as the [B x T, H, D] flash takes: the projections' own layout, transposed back.
    const auto tokens = [&](const at::Tensor& x) {
      return x.transpose(1, 2).reshape({batch * length, x.size(1), x.size(3)});
    };
    const at::Tensor& bounds = documents_.bounds;
    const int64_t longest = documents_.longest;
    const at::Tensor out = std::get<0>(at::_flash_attention_forward(
        tokens(q), tokens(k), tokens(v), bounds, bounds, longest, longest, /*dropout_p=*/0.0,
        /*is_causal=*/true, /*return_debug_mask=*/false));
    return out.view({batch, length, q.size(1), q.size(3)}).transpose(1, 2);
  }
  TORCH_CHECK(q.scalar_type() == mask_.scalar_type(), "attention within documents: queries of ",
              q.scalar_type(), " against a mask built for ", mask_.scalar_type());
  if (q.device().is_cpu()) {
    // Causal as well as masked, so that the kernel skips the tiles above the diagonal.
    return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, /*dropout_p=*/0.0,
                                                                       /*is_causal=*/true, mask_));
  }
  const bool repeat_kv =
      sdpa_needs_repeated_kv(q.device().type(), q.scalar_type(), q.size(1), k.size(1));
  return grouped_query_sdpa(q, k, v, mask_, /*is_causal=*/false, repeat_kv);
}

}  // namespace mltrain
