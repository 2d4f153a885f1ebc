// Attention within documents on a GPU (data.document_masking), against the CPU path that
// tests/model/document_masking_test.cpp and the Python reference check: variable-length flash
// attention in bf16, and SDPA with a boolean mask in fp32, forward and backward, at the attention
// shapes of configs/base.yaml with documents of the demo corpus's lengths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "model/layers/document_attention.h"
#include "model/layers/packed_documents.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::relative_error;

constexpr int64_t kBatch = 4;
constexpr int64_t kLength = 1024;
constexpr int64_t kQueryHeads = 8;
constexpr int64_t kKeyValueHeads = 2;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kEnd = 2;

// Tokens [kBatch, kLength] whose documents are 1 to 200 tokens long, the first row's first one
// the tail of an earlier document.
at::Tensor packed_tokens() {
  at::Tensor tokens = at::randint(3, 4096, {kBatch, kLength});
  const at::Tensor lengths = at::randint(1, 200, {kBatch * kLength});
  int64_t next = 57;
  for (int64_t i = 0; next < kBatch * kLength; ++i) {
    tokens.view({-1})[next] = kEnd;
    next += lengths[i].item<int64_t>();
  }
  return tokens;
}

struct Attended {
  at::Tensor out;
  std::vector<at::Tensor> grads;  // of q, k, v, in fp32
  std::string first_node;         // the autograd node the output came from, under its views
};

// The attention of q, k, v [B, H, T, D] within `documents`, and the gradients of <out, upstream>.
// With `views_of_one_tensor`, q, k and v reach the attention as the attention module hands them
// over: strided views of one [B, T, Hq + 2 Hkv, D] tensor, the fused projection's rotated output.
Attended attend(const PackedDocuments& documents, at::ScalarType dtype, c10::Device device,
                const std::vector<at::Tensor>& qkv, const at::Tensor& upstream,
                bool views_of_one_tensor = false) {
  std::vector<at::Tensor> inputs;
  at::Tensor heads;
  if (views_of_one_tensor) {
    heads = at::cat({qkv[0].transpose(1, 2), qkv[1].transpose(1, 2), qkv[2].transpose(1, 2)}, 2)
                .to(device, dtype)
                .detach()
                .requires_grad_(true);
    for (const at::Tensor& x :
         heads.split_with_sizes({kQueryHeads, kKeyValueHeads, kKeyValueHeads}, 2))
      inputs.push_back(x.transpose(1, 2));
  } else {
    for (const at::Tensor& x : qkv)
      inputs.push_back(x.to(device, dtype).detach().requires_grad_(true));
  }
  const DocumentAttention attention(documents.to(device), dtype, kHeadDim);
  const at::Tensor out = attention(inputs[0], inputs[1], inputs[2]);
  (out.to(at::kFloat) * upstream.to(device)).sum().backward();
  Attended result{out.to(at::kCPU, at::kFloat), {}, ""};
  if (views_of_one_tensor) {
    for (const at::Tensor& grad :
         heads.grad().split_with_sizes({kQueryHeads, kKeyValueHeads, kKeyValueHeads}, 2))
      result.grads.push_back(grad.transpose(1, 2).to(at::kCPU, at::kFloat));
  } else {
    for (const at::Tensor& x : inputs) result.grads.push_back(x.grad().to(at::kCPU, at::kFloat));
  }
  auto node = out.grad_fn();
  while (node && node->name().find("Backward") != std::string::npos &&
         (node->name().rfind("View", 0) == 0 || node->name().rfind("Transpose", 0) == 0 ||
          node->name().rfind("Unsafe", 0) == 0)) {
    node = node->next_edges().front().function;
  }
  result.first_node = node ? node->name() : "";
  return result;
}

class DocumentAttentionOnCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    at::manual_seed(60);
    documents = pack_documents(packed_tokens(), kEnd, /*pin_memory=*/true);
    qkv = {at::randn({kBatch, kQueryHeads, kLength, kHeadDim}),
           at::randn({kBatch, kKeyValueHeads, kLength, kHeadDim}),
           at::randn({kBatch, kKeyValueHeads, kLength, kHeadDim})};
    upstream = at::randn({kBatch, kQueryHeads, kLength, kHeadDim});
    on_cpu = attend(documents, at::kFloat, at::kCPU, qkv, upstream);
  }
  PackedDocuments documents;
  std::vector<at::Tensor> qkv;
  at::Tensor upstream;
  Attended on_cpu;
};

TEST_F(DocumentAttentionOnCuda, Bf16RunsVariableLengthFlashAndMatchesTheCpu) {
  const Attended bf16 = attend(documents, at::kBFloat16, at::kCUDA, qkv, upstream);
  EXPECT_EQ(bf16.first_node, "FlashAttentionBackward0");
  EXPECT_LE(relative_error(bf16.out, on_cpu.out), 2e-2);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(relative_error(bf16.grads[i], on_cpu.grads[i]), 3e-2) << "q, k, v: " << i;
}

TEST_F(DocumentAttentionOnCuda, Bf16TakesStridedViewsOfTheFusedProjection) {
  const Attended bf16 =
      attend(documents, at::kBFloat16, at::kCUDA, qkv, upstream, /*views_of_one_tensor=*/true);
  EXPECT_EQ(bf16.first_node, "FlashAttentionBackward0");
  EXPECT_LE(relative_error(bf16.out, on_cpu.out), 2e-2);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(relative_error(bf16.grads[i], on_cpu.grads[i]), 3e-2) << "q, k, v: " << i;
}

TEST_F(DocumentAttentionOnCuda, Fp32MasksThroughSdpaAndMatchesTheCpu) {
  const Attended fp32 = attend(documents, at::kFloat, at::kCUDA, qkv, upstream);
  EXPECT_LE(relative_error(fp32.out, on_cpu.out), 1e-5);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(relative_error(fp32.grads[i], on_cpu.grads[i]), 1e-5) << "q, k, v: " << i;
}

}  // namespace
}  // namespace mltrain
