// The gradient reducer in one process: bucket assignment and gradients as views.
#include "dist/grad_reducer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace mltrain {
namespace {

std::vector<at::Tensor> parameters_of_sizes(const std::vector<int64_t>& sizes) {
  std::vector<at::Tensor> parameters;
  for (const int64_t size : sizes) parameters.push_back(at::zeros({size}).requires_grad_(true));
  return parameters;
}

TEST(GradReducer, PacksParametersInReverseOrderIntoSizedBuckets) {
  const World world;
  const auto communicator = make_communicator(world, /*cuda=*/false);
  // 1 MiB = 262,144 fp32 values. Reversed, the sizes are 100k, 200k, 300k, 50k, 400k, 150k.
  const auto parameters = parameters_of_sizes({150'000, 400'000, 50'000, 300'000, 200'000, 100'000});
  GradReducer reducer(parameters, *communicator, /*bucket_mb=*/2.0, /*first_bucket_mb=*/1.0, /*overlap=*/true);
  const auto& buckets = reducer.buckets();
  // First bucket up to 1 MiB: 100k + 200k would pass it, so 100k alone; then up to 2 MiB (524,288
  // values): 200k + 300k; then 50k + 400k; then 150k.
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].parameters, (std::vector<size_t>{5}));
  EXPECT_EQ(buckets[1].parameters, (std::vector<size_t>{4, 3}));
  EXPECT_EQ(buckets[2].parameters, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(buckets[3].parameters, (std::vector<size_t>{0}));
  EXPECT_EQ(buckets[1].buffer.numel(), 500'000);
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 200'000}));
  // Each gradient is a view of its bucket: same storage, at its offset.
  EXPECT_TRUE(parameters[3].grad().is_alias_of(buckets[1].buffer));
  EXPECT_EQ(parameters[3].grad().data_ptr<float>(), buckets[1].buffer.data_ptr<float>() + 200'000);
  EXPECT_EQ(parameters[3].grad().sizes(), parameters[3].sizes());
}

TEST(GradReducer, BackwardAccumulatesIntoTheBuckets) {
  const World world;
  const auto communicator = make_communicator(world, false);
  const auto parameters = parameters_of_sizes({3, 4});
  GradReducer reducer(parameters, *communicator, 1.0, 1.0, true);
  for (int micro = 0; micro < 2; ++micro) {
    reducer.set_sync(micro == 1);
    ((parameters[0] * 2).sum() + (parameters[1] * 3).sum()).backward();
  }
  reducer.finish();
  const at::Tensor& buffer = reducer.buckets()[0].buffer;  // reversed: parameter 1, then 0
  EXPECT_TRUE(at::equal(buffer, at::tensor({6.f, 6.f, 6.f, 6.f, 4.f, 4.f, 4.f})));
  EXPECT_TRUE(parameters[0].grad().is_alias_of(buffer)) << "backward kept the views";
  reducer.zero_grad();
  EXPECT_TRUE(at::equal(parameters[1].grad(), at::zeros({4})));
}

}  // namespace
}  // namespace mltrain
