// Which SDPA kernel attention gets on a GPU, at the attention shapes of configs/base.yaml: a fused
// one in bf16 and in fp32, never the math kernel that builds the [B, H, T, T] scores.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/kernels/autocast_region.h"
#include "model/layers/attention.h"
#include "model/layers/model_config.h"
#include "model/layers/rotary.h"

namespace mltrain {
namespace {

// configs/base.yaml: micro_batch 16, seq_len 1024, 8 query heads over 2 key/value heads of 64.
constexpr int64_t kBatch = 16;
constexpr int64_t kLength = 1024;
constexpr int64_t kQueryHeads = 8;
constexpr int64_t kKeyValueHeads = 2;
constexpr int64_t kHeadDim = 64;

// Turns SDPA's math kernel off for one test, so that a call that would need it throws instead.
class WithoutMathKernel {
 public:
  WithoutMathKernel() : was_enabled_(at::globalContext().userEnabledMathSDP()) {
    at::globalContext().setSDPUseMath(false);
  }
  ~WithoutMathKernel() { at::globalContext().setSDPUseMath(was_enabled_); }
  WithoutMathKernel(const WithoutMathKernel&) = delete;
  WithoutMathKernel& operator=(const WithoutMathKernel&) = delete;

 private:
  bool was_enabled_;
};

struct Heads {
  at::Tensor q, k, v;
};

Heads base_config_heads(at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCUDA);
  return {at::randn({kBatch, kQueryHeads, kLength, kHeadDim}, options),
          at::randn({kBatch, kKeyValueHeads, kLength, kHeadDim}, options),
          at::randn({kBatch, kKeyValueHeads, kLength, kHeadDim}, options)};
}

at::SDPBackend fused_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool enable_gqa) {
  return static_cast<at::SDPBackend>(at::_fused_sdp_choice(
      q, k, v, std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/true, std::nullopt, enable_gqa));
}

TEST(AttentionBackend, Bf16GroupedHeadsUseFlashOrCudnn) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  at::manual_seed(20);
  const Heads heads = base_config_heads(at::kBFloat16);
  ASSERT_FALSE(sdpa_needs_repeated_kv(c10::kCUDA, at::kBFloat16, kQueryHeads, kKeyValueHeads));
  const at::SDPBackend choice = fused_choice(heads.q, heads.k, heads.v, /*enable_gqa=*/true);
  EXPECT_TRUE(choice == at::SDPBackend::flash_attention ||
              choice == at::SDPBackend::cudnn_attention)
      << "SDPA backend " << static_cast<int>(choice);
}

TEST(AttentionBackend, Fp32TakesAFusedKernelWithRepeatedKeyValues) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  at::manual_seed(21);
  const Heads heads = base_config_heads(at::kFloat);
  ASSERT_TRUE(sdpa_needs_repeated_kv(c10::kCUDA, at::kFloat, kQueryHeads, kKeyValueHeads));
  const int64_t group = kQueryHeads / kKeyValueHeads;
  const at::SDPBackend choice =
      fused_choice(heads.q, heads.k.repeat_interleave(group, 1),
                   heads.v.repeat_interleave(group, 1), /*enable_gqa=*/false);
  EXPECT_NE(choice, at::SDPBackend::math) << "SDPA backend " << static_cast<int>(choice);
  // The model's own call, not a copy of it: with the math kernel off it runs only if fused.
  const WithoutMathKernel no_math;
  EXPECT_NO_THROW(grouped_query_sdpa(heads.q, heads.k, heads.v, std::nullopt, /*is_causal=*/true,
                                     /*repeat_kv=*/true));
}

// Through the module: its fp32 forward on CUDA, which must not need the math kernel, equals the
// same weights' forward on the CPU. Both are fp32 (cuBLAS without TF32, LibTorch's default);
// the tolerance allows for the kernels' different summation orders.
TEST(AttentionBackend, Fp32ForwardOnCudaEqualsTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  at::manual_seed(22);
  ModelConfig config;  // the base config's attention: d_model 512, 8 / 2 heads of 64
  Attention attention(config, Kernels::aten);
  Rotary rotary(config.head_dim, config.max_seq_len, config.rope_theta);
  const int64_t length = 256;
  const at::Tensor x = at::randn({2, length, config.d_model});
  const at::Tensor cos = rotary->cos(0, length), sin = rotary->sin(0, length);
  at::NoGradGuard no_grad;
  const at::Tensor on_cpu = attention(x, cos, sin);
  attention->to(at::kCUDA);
  at::Tensor on_cuda;
  {
    const WithoutMathKernel no_math;
    on_cuda = attention(x.cuda(), cos.cuda(), sin.cuda()).cpu();
  }
  EXPECT_LE((on_cuda - on_cpu).abs().max().item<double>(), 1e-4)
      << "largest |output| " << on_cpu.abs().max().item<double>();
}

// The module under bf16 autocast, forward and backward, as training runs it: with the math
// kernel off it runs only if its own call keeps q in bf16 and takes a fused kernel.
TEST(AttentionBackend, Bf16ModuleTrainsWithoutTheMathKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  at::manual_seed(23);
  ModelConfig config;
  Attention attention(config, Kernels::aten);
  attention->to(at::kCUDA);
  Rotary rotary(config.head_dim, config.max_seq_len, config.rope_theta);
  const at::Tensor x =
      at::randn({2, kLength, config.d_model}, at::TensorOptions().device(at::kCUDA));
  const at::Tensor cos = rotary->cos(0, kLength).cuda(), sin = rotary->sin(0, kLength).cuda();
  const WithoutMathKernel no_math;
  at::Tensor out;
  {
    const AutocastGuard autocast(at::Device(at::kCUDA), /*enabled=*/true);
    out = attention(x, cos, sin);
  }
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_NO_THROW(out.to(at::kFloat).square().mean().backward());
  EXPECT_TRUE(attention->wqkv->weight.grad().defined());
}

}  // namespace
}  // namespace mltrain
