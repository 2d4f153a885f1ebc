#include "dist/bucket_layout.h"

#include <c10/util/accumulate.h>

#include <stdexcept>
#include <utility>

namespace mltrain {
namespace {

// `elements` rounded up to a multiple of `parts`.
int64_t padded(int64_t elements, int parts) { return (elements + parts - 1) / parts * parts; }

}  // namespace

at::Tensor BucketLayout::member_view(const at::Tensor& bucket, size_t k,
                                     at::IntArrayRef sizes) const {
  return bucket.narrow(0, offsets[k], c10::multiply_integers(sizes)).view(sizes);
}

std::vector<BucketLayout> assign_buckets(const std::vector<at::Tensor>& tensors, BucketSizes sizes,
                                         int parts) {
  if (parts < 1) throw std::invalid_argument("assign_buckets: parts must be at least 1");
  constexpr double kMiB = 1 << 20;
  std::vector<BucketLayout> buckets(1);
  double capacity = sizes.first_bucket_mb * kMiB;
  double filled = 0;
  for (size_t i = tensors.size(); i-- > 0;) {
    const auto bytes = static_cast<double>(tensors[i].numel() * tensors[i].element_size());
    if (!buckets.back().members.empty() && filled + bytes > capacity) {
      buckets.emplace_back();
      filled = 0;
      capacity = sizes.bucket_mb * kMiB;
    }
    BucketLayout& bucket = buckets.back();
    bucket.members.push_back(i);
    bucket.offsets.push_back(bucket.elements);
    bucket.elements += tensors[i].numel();
    filled += bytes;
  }
  if (buckets.back().members.empty()) return {};  // no tensors
  for (BucketLayout& bucket : buckets) bucket.elements = padded(bucket.elements, parts);
  return buckets;
}

std::vector<BucketLayout> lay_out_units(const std::vector<at::Tensor>& tensors,
                                        const std::vector<std::vector<size_t>>& units, int parts) {
  if (parts < 1) throw std::invalid_argument("lay_out_units: parts must be at least 1");
  std::vector<BucketLayout> layouts;
  for (const std::vector<size_t>& unit : units) {
    BucketLayout layout;
    for (const size_t i : unit) {
      layout.members.push_back(i);
      layout.offsets.push_back(layout.elements);
      layout.elements += tensors.at(i).numel();
    }
    layout.elements = padded(layout.elements, parts);
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

}  // namespace mltrain
