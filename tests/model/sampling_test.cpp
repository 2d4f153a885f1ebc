#include "model/generation/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mltrain {
namespace {

// The logits of the closed-form cases; softmax(logits / t) written out.
const std::vector<float> kLogits = {2.0f, 1.0f, 0.0f, -1.0f};

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p;
  double total = 0.0;
  for (const float logit : logits) total += std::exp(logit / temperature);
  for (const float logit : logits) p.push_back(std::exp(logit / temperature) / total);
  return p;
}

// p with only the tokens `kept` left, renormalised.
std::vector<double> restricted(const std::vector<double>& p, const std::vector<int>& kept) {
  std::vector<double> result(p.size(), 0.0);
  double total = 0.0;
  for (const int i : kept) total += p[i];
  for (const int i : kept) result[i] = p[i] / total;
  return result;
}

void expect_distribution(const at::Tensor& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(actual.scalar_type(), at::kFloat);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual[static_cast<int64_t>(i)].item<double>(), expected[i], 1e-6) << "token " << i;
}

at::Tensor logits_tensor(const std::vector<float>& logits) { return at::tensor(logits); }

SamplingOptions options(double temperature, int64_t top_k, double top_p) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  return o;
}

TEST(Sampling, TemperatureDividesTheLogitsBeforeTheSoftmax) {
  for (const double t : {0.5, 1.0, 2.0}) {
    SCOPED_TRACE(t);
    expect_distribution(sampling_distribution(logits_tensor(kLogits), options(t, 0, 1.0)),
                        softmax(kLogits, t));
  }
}

// Two logits a distance d apart at temperature t: the larger has probability 1 / (1 + e^(-d / t)),
// at any positive t. The logits are large enough that dividing them by a small t overflows fp32
// (1e4 / 1e-35 = 1e39), as dividing before subtracting their largest did, giving NaN; the tiny
// temperatures give the argmax alone, and below fp32's smallest (1e-46) and at double's (5e-324)
// too; the huge ones give both alike.
TEST(Sampling, TwoLogitsGiveTheirClosedFormAtAnyTemperature) {
  const std::vector<float> logits = {1.0e4f, 1.0e4f - 1.0f};
  for (const double t : {5e-324, 1e-300, 1e-46, 1e-38, 1e-35, 1e-30, 0.01, 0.1, 0.5, 1.0, 10.0,
                         1e30, 1e300, 1.7e308}) {
    SCOPED_TRACE(t);
    const double larger = 1.0 / (1.0 + std::exp(-1.0 / t));
    expect_distribution(sampling_distribution(logits_tensor(logits), options(t, 0, 1.0)),
                        {larger, 1.0 - larger});
  }
}

// Below the temperature where the others' probabilities underflow, every draw is the argmax
// (greedy), whatever the generator; tokens tied for the largest share its probability.
TEST(Sampling, TinyTemperaturesDrawTheArgmaxAsGreedyDoes) {
  const std::vector<float> logits = {0.5f, -2.0f, 60.0f, 59.0f, -60.0f};
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(11);
  for (const double t : {1e-3, 1e-30, 1e-38, 1e-39, 1e-45, 1e-300, 5e-324}) {
    SCOPED_TRACE(t);
    for (int draw = 0; draw < 20; ++draw)
      EXPECT_EQ(choose_token(logits_tensor(logits), options(t, 50, 0.95), generator), 2);
  }
  expect_distribution(
      sampling_distribution(logits_tensor({3.0f, 1.0f, 3.0f}), options(1e-300, 0, 1.0)),
      {0.5, 0.0, 0.5});
}

TEST(Sampling, TopKKeepsTheKMostLikelyRenormalised) {
  const std::vector<double> p = softmax(kLogits, 1.0);
  // Out of index order, so that "most likely" cannot be mistaken for "first".
  const std::vector<float> shuffled = {0.0f, 2.0f, -1.0f, 1.0f};
  const std::vector<double> q = softmax(shuffled, 1.0);
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 1, 1.0)),
                      restricted(p, {0}));
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 3, 1.0)),
                      restricted(p, {0, 1, 2}));
  expect_distribution(sampling_distribution(logits_tensor(shuffled), options(1.0, 2, 1.0)),
                      restricted(q, {1, 3}));
  // 0 and k >= V keep every token.
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 0, 1.0)), p);
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 9, 1.0)), p);
}

TEST(Sampling, TopPKeepsTheSmallestMostLikelySetWhoseMassReachesP) {
  const std::vector<double> p = softmax(kLogits, 1.0);  // 0.644, 0.237, 0.087, 0.032
  ASSERT_LT(p[0], 0.8);
  ASSERT_GT(p[0] + p[1], 0.8);
  ASSERT_LT(p[0] + p[1], 0.95);
  ASSERT_GT(p[0] + p[1] + p[2], 0.95);
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 0, 0.5)),
                      restricted(p, {0}));
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 0, 0.8)),
                      restricted(p, {0, 1}));
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(1.0, 0, 0.95)),
                      restricted(p, {0, 1, 2}));
  const std::vector<float> shuffled = {-1.0f, 0.0f, 2.0f, 1.0f};
  expect_distribution(sampling_distribution(logits_tensor(shuffled), options(1.0, 0, 0.8)),
                      restricted(softmax(shuffled, 1.0), {2, 3}));
}

TEST(Sampling, TopPActsOnTheTopKDistributionAtTheTemperature) {
  // At t = 2 the top 3 renormalised are 0.506, 0.307, 0.186: p = 0.75 needs two of them, though
  // two hold less than 0.75 of the full distribution.
  const std::vector<double> p = softmax(kLogits, 2.0);
  const std::vector<double> top3 = restricted(p, {0, 1, 2});
  ASSERT_LT(p[0] + p[1], 0.75);
  ASSERT_GT(top3[0] + top3[1], 0.75);
  expect_distribution(sampling_distribution(logits_tensor(kLogits), options(2.0, 3, 0.75)),
                      restricted(p, {0, 1}));
}

TEST(Sampling, DrawFrequenciesMatchTheDistribution) {
  const at::Tensor probabilities =
      sampling_distribution(logits_tensor(kLogits), options(0.7, 3, 1.0));
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(42);
  const int draws = 20000;
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts.at(draw_token(probabilities, generator));
  for (size_t i = 0; i < counts.size(); ++i) {
    const double p = probabilities[static_cast<int64_t>(i)].item<double>();
    // Five standard deviations of a binomial frequency: a correct sampler fails this about once
    // in a million seeds, one off by a percent of mass fails it.
    const double bound = 5.0 * std::sqrt(p * (1.0 - p) / draws);
    EXPECT_NEAR(static_cast<double>(counts[i]) / draws, p, bound) << "token " << i;
  }
  EXPECT_EQ(counts[3], 0) << "top-k removed token 3, yet it was drawn";
}

TEST(Sampling, GreedyTakesTheArgmaxAndLeavesTheGeneratorAlone) {
  at::Generator used = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(7);
  const std::vector<float> logits = {0.5f, -2.0f, 3.0f, 2.9f};
  EXPECT_EQ(choose_token(logits_tensor(logits), options(0.0, 50, 0.95), used), 2);
  EXPECT_TRUE(at::equal(at::rand({4}, used), at::rand({4}, fresh)));
}

TEST(Sampling, ASeedReproducesItsDrawsAndAnotherSeedDiffers) {
  const at::Tensor logits = at::randn({50});
  const auto draws = [&](uint64_t seed) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<int64_t> tokens;
    for (int i = 0; i < 40; ++i)
      tokens.push_back(choose_token(logits, options(1.0, 0, 1.0), generator));
    return tokens;
  };
  EXPECT_EQ(draws(3), draws(3));
  EXPECT_NE(draws(3), draws(4));
}

}  // namespace
}  // namespace mltrain
