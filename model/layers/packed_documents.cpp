#include "model/layers/packed_documents.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace mltrain {

PackedDocuments PackedDocuments::to(c10::Device device) const {
  return {positions.to(device, /*non_blocking=*/true), bounds.to(device, /*non_blocking=*/true),
          longest};
}

PackedDocuments pack_documents(const at::Tensor& tokens, int64_t document_start, bool pin_memory) {
  TORCH_CHECK(tokens.device().is_cpu() && tokens.scalar_type() == at::kLong && tokens.dim() == 2,
              "pack_documents: tokens must be [B, T] int64 on the CPU, not ", tokens.sizes(), " ",
              tokens.scalar_type(), " on ", tokens.device());
  const at::Tensor rows = tokens.contiguous();
  const int64_t batch = rows.size(0);
  const int64_t length = rows.size(1);
  TORCH_CHECK(batch * length <= std::numeric_limits<int32_t>::max(),
              "pack_documents: the bounds are int32, and ", batch * length, " tokens exceed them");
  const auto host = at::TensorOptions().pinned_memory(pin_memory);
  at::Tensor positions = at::empty({batch, length}, host.dtype(at::kLong));
  std::vector<int32_t> bounds;
  int64_t longest = 0;
  const int64_t* token = rows.const_data_ptr<int64_t>();
  int64_t* position = positions.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < batch * length; ++i) {
    const bool begins = i % length == 0 || token[i] == document_start;
    if (begins) bounds.push_back(static_cast<int32_t>(i));
    position[i] = begins ? 0 : position[i - 1] + 1;
    longest = std::max(longest, position[i] + 1);
  }
  bounds.push_back(static_cast<int32_t>(batch * length));
  at::Tensor bounds_tensor = at::empty({static_cast<int64_t>(bounds.size())}, host.dtype(at::kInt));
  std::copy(bounds.begin(), bounds.end(), bounds_tensor.mutable_data_ptr<int32_t>());
  return {positions, bounds_tensor, longest};
}

}  // namespace mltrain
