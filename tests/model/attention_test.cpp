#include "model/layers/attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "model/layers/kv_cache.h"
#include "model/layers/llama.h"
#include "tests/model/tiny_config.h"

namespace mltrain {
namespace {

using testing::tiny_config;

// Attention written out: separate q, k and v products (the rows of wqkv in that order), each
// key/value head repeated for its group of query heads, then softmax(q k^T / sqrt(d) + causal mask)
// v.
at::Tensor repeat_kv_attention(AttentionImpl& attention, const ModelConfig& config,
                               const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t group = config.n_q_heads / config.n_kv_heads;
  const int64_t q_rows = config.n_q_heads * config.head_dim;
  const int64_t kv_rows = config.n_kv_heads * config.head_dim;
  const auto heads = [&](int64_t first_row, int64_t n) {
    const at::Tensor weight = attention.wqkv->weight.narrow(0, first_row, n * config.head_dim);
    return at::linear(x, weight).view({b, t, n, config.head_dim});
  };
  const at::Tensor q = apply_rotary(heads(0, config.n_q_heads), cos, sin).transpose(1, 2);
  const at::Tensor k = apply_rotary(heads(q_rows, config.n_kv_heads), cos, sin)
                           .transpose(1, 2)
                           .repeat_interleave(group, 1);
  const at::Tensor v =
      heads(q_rows + kv_rows, config.n_kv_heads).transpose(1, 2).repeat_interleave(group, 1);
  const at::Tensor future = at::ones({t, t}, at::kBool).triu(1);
  const at::Tensor scores = (q.matmul(k.transpose(-1, -2)) / std::sqrt(double(config.head_dim)))
                                .masked_fill(future, -INFINITY);
  const at::Tensor out = scores.softmax(-1).matmul(v);
  return at::linear(out.transpose(1, 2).reshape({b, t, -1}), attention.wo->weight);
}

TEST(Attention, GroupedQueryThroughSdpaEqualsRepeatedKeyValues) {
  at::manual_seed(10);
  const ModelConfig config = tiny_config();
  Attention attention(config, Kernels::fused_cpu);
  Rotary rotary(config.head_dim, config.max_seq_len, config.rope_theta);
  const at::Tensor x = at::randn({3, 20, config.d_model});
  const at::Tensor cos = rotary->cos(0, 20), sin = rotary->sin(0, 20);
  const at::Tensor fast = attention(x, cos, sin);
  const at::Tensor explicit_math = repeat_kv_attention(*attention, config, x, cos, sin);
  EXPECT_LE((fast - explicit_math).abs().max().item<double>(), 1e-6);
}

// The repeated-K/V path is taken only on CUDA, but it is plain SDPA: here it must equal the
// grouped heads, for each way forward() calls it: causal self-attention, new tokens after a cached
// prefix (an explicit mask), and one token over the cache (neither).
TEST(Attention, RepeatedKeyValuesEqualGroupedHeads) {
  at::manual_seed(12);
  struct Case {
    int64_t queries;
    int64_t keys;
    bool is_causal;
    bool explicit_mask;
  };
  for (const Case& c :
       {Case{12, 12, true, false}, Case{3, 11, false, true}, Case{1, 9, false, false}}) {
    const at::Tensor q = at::randn({2, 4, c.queries, 16});
    const at::Tensor k = at::randn({2, 2, c.keys, 16});
    const at::Tensor v = at::randn({2, 2, c.keys, 16});
    std::optional<at::Tensor> mask;
    if (c.explicit_mask) {
      const int64_t start_pos = c.keys - c.queries;
      const at::Tensor query_pos = at::arange(start_pos, c.keys).unsqueeze(1);
      mask = at::arange(c.keys).unsqueeze(0) <= query_pos;
    }
    const at::Tensor grouped = grouped_query_sdpa(q, k, v, mask, c.is_causal, false);
    const at::Tensor repeated = grouped_query_sdpa(q, k, v, mask, c.is_causal, true);
    EXPECT_LE((repeated - grouped).abs().max().item<double>(), 1e-6)
        << c.queries << " queries over " << c.keys << " keys";
  }
}

TEST(Attention, KeyValuesAreRepeatedOnlyForGroupedHeadsOutsideHalfPrecisionOnCuda) {
  EXPECT_TRUE(sdpa_needs_repeated_kv(c10::kCUDA, at::kFloat, 8, 2));
  EXPECT_TRUE(sdpa_needs_repeated_kv(c10::kCUDA, at::kDouble, 8, 2));
  EXPECT_FALSE(sdpa_needs_repeated_kv(c10::kCUDA, at::kBFloat16, 8, 2));
  EXPECT_FALSE(sdpa_needs_repeated_kv(c10::kCUDA, at::kHalf, 8, 2));
  EXPECT_FALSE(sdpa_needs_repeated_kv(c10::kCUDA, at::kFloat, 8, 8));
  EXPECT_FALSE(sdpa_needs_repeated_kv(c10::kCPU, at::kFloat, 8, 2));
}

class TinyLlama : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(11);
    model = Llama(tiny_config(), Kernels::fused_cpu);
    model->eval();
    tokens = at::randint(tiny_config().vocab_size, {2, 24});
  }
  Llama model{nullptr};
  at::Tensor tokens;
};

TEST_F(TinyLlama, FutureTokensDoNotChangeEarlierLogits) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = model(tokens);
  for (int64_t t : {0, 7, 22}) {
    at::Tensor changed = tokens.clone();
    changed.narrow(1, t + 1, 24 - t - 1).random_(tiny_config().vocab_size);
    ASSERT_FALSE(at::equal(changed, tokens));
    const at::Tensor changed_logits = model(changed);
    EXPECT_TRUE(at::equal(changed_logits.narrow(1, 0, t + 1), logits.narrow(1, 0, t + 1)))
        << "t = " << t;
    // The test can fail: the changed positions themselves do change.
    EXPECT_FALSE(at::equal(changed_logits.narrow(1, t + 1, 1), logits.narrow(1, t + 1, 1)));
  }
}

TEST_F(TinyLlama, CachedDecodingReproducesFullSequenceLogits) {
  at::NoGradGuard no_grad;
  const at::Tensor full = model(tokens);
  KVCache cache(tiny_config(), 2, 24, at::TensorOptions().dtype(at::kFloat));
  std::vector<at::Tensor> pieces;
  // A prompt of 5, then 3 at once (an explicit mask after a cached prefix), then one by one.
  pieces.push_back(model(tokens.narrow(1, 0, 5), 0, &cache));
  pieces.push_back(model(tokens.narrow(1, 5, 3), 5, &cache));
  for (int64_t position = 8; position < 24; ++position) {
    pieces.push_back(model(tokens.narrow(1, position, 1), position, &cache));
  }
  const at::Tensor incremental = at::cat(pieces, 1);
  EXPECT_LE((incremental - full).abs().max().item<double>(), 1e-5);
}

TEST_F(TinyLlama, PositionsBeyondMaxSeqLenAreRefused) {
  at::NoGradGuard no_grad;
  EXPECT_THROW(model(at::zeros({1, 65}, at::kLong)), std::exception);
  EXPECT_THROW(model(at::zeros({1, 2}, at::kLong), 63), std::exception);
}

}  // namespace
}  // namespace mltrain
