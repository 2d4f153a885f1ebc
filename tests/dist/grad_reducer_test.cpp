// The gradient reducer in one process: bucket assignment and gradients as views.
#include "dist/grad_reducer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

namespace mltrain {
namespace {

std::vector<at::Tensor> parameters_of_sizes(const std::vector<int64_t>& sizes) {
  std::vector<at::Tensor> parameters;
  for (const int64_t size : sizes) parameters.push_back(at::zeros({size}).requires_grad_(true));
  return parameters;
}

TEST(OverlapAllReduce, AutoOverlapsOnCudaOnlyAndAnExplicitChoiceIsTaken) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device gpu(c10::kCUDA, 0);
  EXPECT_TRUE(overlap_all_reduce("auto", gpu));
  EXPECT_FALSE(overlap_all_reduce("auto", cpu));
  for (const c10::Device& device : {cpu, gpu}) {
    EXPECT_TRUE(overlap_all_reduce("true", device));
    EXPECT_FALSE(overlap_all_reduce("false", device));
  }
}

// The layout alone: members last first, offsets in order, each bucket padded to its parts.
TEST(AssignBuckets, PacksLastFirstBySizeAndPadsEachBucketToItsParts) {
  // 1 MiB = 262,144 fp32 values: the first bucket takes 100k alone (100k + 200k would pass it),
  // the next up to 2 MiB takes 200k + 300k, the last 50k.
  const auto tensors = parameters_of_sizes({50'000, 300'000, 200'000, 100'000});
  const std::vector<BucketLayout> buckets =
      assign_buckets(tensors, {.bucket_mb = 2.0, .first_bucket_mb = 1.0}, /*parts=*/3);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].members, std::vector<size_t>{3});
  EXPECT_EQ(buckets[1].members, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 200'000}));
  EXPECT_EQ(buckets[2].members, std::vector<size_t>{0});
  // 100,000 and 500,000 round up to multiples of 3; 50,000 too.
  EXPECT_EQ(buckets[0].elements, 100'002);
  EXPECT_EQ(buckets[1].elements, 500'001);
  EXPECT_EQ(buckets[2].elements, 50'001);
  EXPECT_EQ(buckets[1].part_elements(3), 166'667);
  EXPECT_TRUE(assign_buckets({}, {}).empty());
}

TEST(GradReducer, PacksParametersInReverseOrderIntoSizedBuckets) {
  const World world;
  const auto communicator = make_communicator(world);
  // 1 MiB = 262,144 fp32 values. Reversed, the sizes are 100k, 200k, 300k, 50k, 400k, 150k.
  const auto parameters =
      parameters_of_sizes({150'000, 400'000, 50'000, 300'000, 200'000, 100'000});
  GradReducer reducer(parameters,
                      assign_buckets(parameters, {.bucket_mb = 2.0, .first_bucket_mb = 1.0}),
                      *communicator, {});
  // First bucket up to 1 MiB: 100k + 200k would pass it, so 100k alone; then up to 2 MiB (524,288
  // values): 200k + 300k; then 50k + 400k; then 150k. Each gradient is a view of its bucket: the
  // gradients of one bucket share a storage of the bucket's size, each at its offset.
  const auto storage_of = [&](size_t i) { return parameters[i].grad().storage().data(); };
  const auto storage_values = [&](size_t i) {
    return static_cast<int64_t>(parameters[i].grad().storage().nbytes() / sizeof(float));
  };
  EXPECT_EQ(storage_values(5), 100'000);
  EXPECT_EQ(storage_of(4), storage_of(3));
  EXPECT_EQ(storage_values(4), 500'000);
  EXPECT_EQ(parameters[4].grad().storage_offset(), 0);
  EXPECT_EQ(parameters[3].grad().storage_offset(), 200'000);
  EXPECT_EQ(storage_of(2), storage_of(1));
  EXPECT_EQ(storage_values(2), 450'000);
  EXPECT_EQ(parameters[2].grad().storage_offset(), 0);
  EXPECT_EQ(parameters[1].grad().storage_offset(), 50'000);
  EXPECT_EQ(storage_values(0), 150'000);
  const std::set<const void*> storages{storage_of(0), storage_of(1), storage_of(3), storage_of(5)};
  EXPECT_EQ(storages.size(), 4u) << "four buckets";
  EXPECT_EQ(parameters[3].grad().sizes(), parameters[3].sizes());
}

// A layout that leaves a parameter out, places one twice or puts one outside its bucket is refused.
TEST(GradReducer, RefusesALayoutThatDoesNotPlaceEveryParameterOnce) {
  const World world;
  const auto communicator = make_communicator(world);
  const auto parameters = parameters_of_sizes({3, 4});
  const BucketLayout first{.members = {0}, .offsets = {0}, .elements = 3};
  const BucketLayout both{.members = {1, 0}, .offsets = {0, 4}, .elements = 7};
  const BucketLayout too_short{.members = {1, 0}, .offsets = {0, 4}, .elements = 6};
  for (const std::vector<BucketLayout>& layout :
       std::vector<std::vector<BucketLayout>>{{first}, {first, both}, {too_short}}) {
    EXPECT_THROW(GradReducer(parameters, layout, *communicator, {}), std::invalid_argument);
  }
  EXPECT_NO_THROW(GradReducer(parameters, {both}, *communicator, {}));
}

TEST(GradReducer, BackwardAccumulatesIntoTheBuckets) {
  const World world;
  const auto communicator = make_communicator(world);
  const auto parameters = parameters_of_sizes({3, 4});
  GradReducer reducer(parameters, assign_buckets(parameters, {.bucket_mb = 1.0}), *communicator,
                      {});
  for (int micro = 0; micro < 2; ++micro) {
    reducer.set_sync(micro == 1);
    ((parameters[0] * 2).sum() + (parameters[1] * 3).sum()).backward();
  }
  reducer.finish();
  // One bucket, parameter 1 then 0 (reversed): the whole buffer is the storage of their gradients.
  const at::Tensor buffer = at::empty({0}).set_(parameters[1].grad().storage());
  EXPECT_TRUE(at::equal(buffer, at::tensor({6.f, 6.f, 6.f, 6.f, 4.f, 4.f, 4.f})));
  EXPECT_TRUE(parameters[0].grad().is_alias_of(buffer)) << "backward kept the views";
  reducer.zero_grad();
  EXPECT_TRUE(at::equal(parameters[1].grad(), at::zeros({4})));
}

// Module::zero_grad() leaves .grad undefined, and backward then makes a new tensor; a replaced
// .grad receives backward's accumulation instead of the bucket. Either way the reducer copies the
// gradient into its bucket and makes .grad the bucket view again.
TEST(GradReducer, AReplacedGradIsCopiedBackIntoItsBucket) {
  const World world;
  const auto communicator = make_communicator(world);
  const auto parameters = parameters_of_sizes({3, 4});
  GradReducer reducer(parameters, assign_buckets(parameters, {.bucket_mb = 1.0}), *communicator,
                      {});
  const at::Tensor bucket = at::empty({0}).set_(parameters[0].grad().storage());
  const auto backward = [&] { ((parameters[0] * 2).sum() + (parameters[1] * 3).sum()).backward(); };

  backward();
  reducer.finish();
  EXPECT_EQ(reducer.gradients_copied_in(), 0) << "backward accumulates into the views";
  reducer.zero_grad();

  parameters[0].mutable_grad() = at::Tensor();  // as Module::zero_grad()
  parameters[1].mutable_grad() = at::full({4}, 10.f);
  backward();
  reducer.finish();
  EXPECT_EQ(reducer.gradients_copied_in(), 2);
  EXPECT_TRUE(at::equal(bucket, at::tensor({13.f, 13.f, 13.f, 13.f, 2.f, 2.f, 2.f})));
  for (const at::Tensor& parameter : parameters) {
    EXPECT_TRUE(parameter.grad().is_alias_of(bucket)) << "the view is back";
  }

  // A parameter that backward does not reach, its .grad left undefined: a zero gradient.
  reducer.zero_grad();
  parameters[1].mutable_grad() = at::Tensor();
  (parameters[0] * 5).sum().backward();
  reducer.finish();
  EXPECT_TRUE(at::equal(bucket, at::tensor({0.f, 0.f, 0.f, 0.f, 5.f, 5.f, 5.f})));
  EXPECT_TRUE(parameters[1].grad().is_alias_of(bucket));
}

}  // namespace
}  // namespace mltrain
