#pragma once

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mltrain {

// Where tensors lie in one flat bucket: the shape gradients take on the wire (the reducer's
// buckets) and, under ZeRO-1, the shape of the parameters each rank updates a part of.
struct BucketLayout {
  std::vector<size_t> members;   // indices into the laid-out tensors, in the bucket's order
  std::vector<int64_t> offsets;  // each member's first element in the bucket
  int64_t elements = 0;          // the bucket's length, padded to a multiple of its parts

  // The length of each of `parts` equal parts (ZeRO-1: one per rank).
  int64_t part_elements(int parts) const { return elements / parts; }
  // Member k's place in `bucket`, a flat tensor of this layout, in the shape `sizes`.
  at::Tensor member_view(const at::Tensor& bucket, size_t k, at::IntArrayRef sizes) const;
};

struct BucketSizes {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;  // small, so that the first collective starts early in backward
};

// Packs `tensors`, last first (roughly the order backward produces their gradients), into
// buckets: the first of about first_bucket_mb, so that communication starts early, the rest of
// about bucket_mb; a tensor larger than a bucket gets one of its own. As DDP's
// compute_bucket_assignment_by_size, a pure function of the tensors' sizes, so that every rank
// lays out the same buckets. Each bucket's length is padded to a multiple of `parts`, so that it
// cuts into `parts` equal parts.
std::vector<BucketLayout> assign_buckets(const std::vector<at::Tensor>& tensors, BucketSizes sizes,
                                         int parts = 1);

// One bucket per unit of ZeRO-3 (unit_shards.h): `units` lists the indices into `tensors` of each
// unit's members, in order. Each bucket's length is padded to a multiple of `parts`.
std::vector<BucketLayout> lay_out_units(const std::vector<at::Tensor>& tensors,
                                        const std::vector<std::vector<size_t>>& units, int parts);

}  // namespace mltrain
