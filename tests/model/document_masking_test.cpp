// Document masking: windows read as the documents packed into them. Every document must come out
// as it would alone: its logits, and its share of the loss's gradient, equal those of the document
// run through the plain model by itself, within 1e-5 in fp32. Against the Python reference too:
// reference_parity_test.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/kernels/autocast_region.h"
#include "model/layers/document_attention.h"
#include "model/layers/llama.h"
#include "model/layers/packed_documents.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::relative_error;
using testing::tiny_config;

constexpr int64_t kEnd = 3;  // the end-of-document token of these tests

TEST(PackDocuments, DocumentsBeginAtEachEndTokenAndAtEachRow) {
  const at::Tensor tokens =
      at::tensor({5, 2, 3, 8, 9, 3, 4, 7, 3, 3, 6, 1}, at::kLong).view({2, 6});
  const PackedDocuments documents = pack_documents(tokens, kEnd);
  // Row 0: a tail 5 2, then 3 8 9, then 3. Row 1: a tail 4 7, then 3, then 3 6 1.
  const std::vector<int64_t> positions = {0, 1, 0, 1, 2, 0, 0, 1, 0, 0, 1, 2};
  EXPECT_TRUE(at::equal(documents.positions, at::tensor(positions, at::kLong).view({2, 6})));
  EXPECT_TRUE(at::equal(documents.bounds, at::tensor({0, 2, 5, 6, 8, 9, 12}, at::kInt)));
  EXPECT_EQ(documents.longest, 3);
}

TEST(PackDocuments, AWindowInsideOneDocumentIsOneDocument) {
  const at::Tensor tokens = at::arange(10, 30, at::kLong).view({2, 10});
  const PackedDocuments documents = pack_documents(tokens, kEnd);
  EXPECT_TRUE(at::equal(documents.positions, at::arange(10, at::kLong).repeat({2, 1})));
  EXPECT_TRUE(at::equal(documents.bounds, at::tensor({0, 10, 20}, at::kInt)));
  EXPECT_EQ(documents.longest, 10);
}

TEST(PackDocuments, RefusesTokensThatAreNotInt64Rows) {
  EXPECT_THROW(pack_documents(at::zeros({2, 4}, at::kInt), kEnd), c10::Error);
  EXPECT_THROW(pack_documents(at::zeros({8}, at::kLong), kEnd), c10::Error);
}

// A window of `rows` random tokens other than kEnd, with kEnd where each row's documents begin
// (a row whose first start is not 0 begins with the tail of an earlier document).
struct PackedWindow {
  at::Tensor tokens;   // [rows, length]
  at::Tensor targets;  // the next tokens
  std::vector<std::vector<int64_t>> starts;
};

PackedWindow packed_window(int64_t length, std::vector<std::vector<int64_t>> starts) {
  const int64_t rows = static_cast<int64_t>(starts.size());
  at::Tensor window = at::randint(tiny_config().vocab_size - 1, {rows, length + 1});
  window += (window >= kEnd).to(at::kLong);  // no kEnd anywhere yet
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t start : starts[row]) window[row][start] = kEnd;
  }
  return {window.narrow(1, 0, length).contiguous(), window.narrow(1, 1, length).contiguous(),
          std::move(starts)};
}

// Each document of `window` as [row, first, length], from the starts it was built with.
std::vector<std::vector<int64_t>> spans(const PackedWindow& window) {
  const int64_t length = window.tokens.size(1);
  std::vector<std::vector<int64_t>> result;
  for (size_t row = 0; row < window.starts.size(); ++row) {
    std::vector<int64_t> bounds = window.starts[row];
    if (bounds.empty() || bounds.front() != 0) bounds.insert(bounds.begin(), 0);
    bounds.push_back(length);
    for (size_t i = 0; i + 1 < bounds.size(); ++i)
      result.push_back({static_cast<int64_t>(row), bounds[i], bounds[i + 1] - bounds[i]});
  }
  return result;
}

// Row 0 starts mid-document and holds four documents, one of them a single token; row 1 is one
// document from its end-of-document token on; row 2 lies inside one document.
PackedWindow mixed_window() { return packed_window(24, {{5, 12, 13}, {0}, {}}); }

class DocumentMasking : public ::testing::TestWithParam<Kernels> {
 protected:
  void SetUp() override {
    at::manual_seed(31);
    model = Llama(tiny_config(), GetParam());
    window = mixed_window();
  }
  Llama model{nullptr};
  PackedWindow window;
};

TEST_P(DocumentMasking, EachDocumentsLogitsAreThoseItHasAlone) {
  at::NoGradGuard no_grad;
  const at::Tensor packed =
      model->forward_packed(window.tokens, pack_documents(window.tokens, kEnd));
  for (const std::vector<int64_t>& span : spans(window)) {
    const at::Tensor alone = model(window.tokens[span[0]].narrow(0, span[1], span[2]).unsqueeze(0));
    EXPECT_LE(relative_error(packed[span[0]].narrow(0, span[1], span[2]), alone[0]), 1e-5)
        << "row " << span[0] << ", tokens " << span[1] << " + " << span[2];
  }
  // The test can fail: without the documents, the later ones see the earlier.
  const at::Tensor unmasked = model(window.tokens);
  EXPECT_GT(relative_error(unmasked[0].narrow(0, 5, 7), packed[0].narrow(0, 5, 7)), 1e-2);
  EXPECT_LE(relative_error(unmasked[2], packed[2]), 1e-5);  // one document, masked or not
}

// The packed window's mean loss is each document's summed token losses over all the tokens: its
// gradient is the sum of the documents' gradients, each computed alone.
TEST_P(DocumentMasking, GradientsAreTheSumOfEachDocumentsAlone) {
  const PackedDocuments documents = pack_documents(window.tokens, kEnd);
  model->loss(window.tokens, window.targets, &documents).backward();
  std::vector<at::Tensor> packed;
  for (const at::Tensor& parameter : model->parameters())
    packed.push_back(parameter.grad().clone());

  model->zero_grad();
  const double total = static_cast<double>(window.tokens.numel());
  for (const std::vector<int64_t>& span : spans(window)) {
    const auto piece = [&](const at::Tensor& rows) {
      return rows[span[0]].narrow(0, span[1], span[2]).unsqueeze(0);
    };
    (model->loss(piece(window.tokens), piece(window.targets)) *
     (static_cast<double>(span[2]) / total))
        .backward();
  }
  const std::vector<at::Tensor> parameters = model->parameters();
  for (size_t i = 0; i < parameters.size(); ++i)
    EXPECT_LE(relative_error(packed[i], parameters[i].grad()), 1e-5) << "parameter " << i;
}

TEST_P(DocumentMasking, ActivationCheckpointingGivesTheSameGradients) {
  const PackedDocuments documents = pack_documents(window.tokens, kEnd);
  model->loss(window.tokens, window.targets, &documents).backward();
  std::vector<at::Tensor> kept;
  for (const at::Tensor& parameter : model->parameters()) kept.push_back(parameter.grad().clone());

  model->zero_grad();
  model->set_activation_checkpointing(true);
  model->loss(window.tokens, window.targets, &documents).backward();
  const std::vector<at::Tensor> parameters = model->parameters();
  for (size_t i = 0; i < parameters.size(); ++i)
    EXPECT_TRUE(at::equal(kept[i], parameters[i].grad())) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(Kernels, DocumentMasking,
                         ::testing::Values(Kernels::fused_cpu, Kernels::aten),
                         [](const auto& info) {
                           return info.param == Kernels::aten ? "Aten" : "FusedCpu";
                         });

// Attention alone, over windows longer than the CPU kernel's blocks of queries and keys (so that
// whole blocks fall outside a query's document): each document's output equals causal SDPA over
// that document alone, in fp32 within 1e-5, and in bf16 near it.
TEST(DocumentAttentionOnTheCpu, EachDocumentAttendsAsItWouldAlone) {
  at::manual_seed(33);
  const int64_t batch = 2, length = 700, q_heads = 4, kv_heads = 2, head_dim = 32;
  std::vector<std::vector<int64_t>> starts = {{3, 150, 151, 420, 690}, {0, 520}};
  const PackedWindow window = packed_window(length, starts);
  const PackedDocuments documents = pack_documents(window.tokens, kEnd);
  const at::Tensor q = at::randn({batch, q_heads, length, head_dim});
  const at::Tensor k = at::randn({batch, kv_heads, length, head_dim});
  const at::Tensor v = at::randn({batch, kv_heads, length, head_dim});
  const at::Tensor fp32 = DocumentAttention(documents, at::kFloat, head_dim)(q, k, v);
  const at::Tensor bf16 = DocumentAttention(documents, at::kBFloat16, head_dim)(
      q.to(at::kBFloat16), k.to(at::kBFloat16), v.to(at::kBFloat16));
  for (const std::vector<int64_t>& span : spans(window)) {
    const auto piece = [&](const at::Tensor& x) {
      return x.narrow(0, span[0], 1).narrow(2, span[1], span[2]);
    };
    const at::Tensor alone =
        at::scaled_dot_product_attention(piece(q), piece(k), piece(v), std::nullopt, 0.0,
                                         /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
    EXPECT_LE(relative_error(piece(fp32), alone), 1e-5) << "row " << span[0] << " at " << span[1];
    EXPECT_LE(relative_error(piece(bf16), alone), 2e-2) << "row " << span[0] << " at " << span[1];
  }
  // The test can fail: over the whole window the documents differ from causal attention.
  const at::Tensor whole = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true,
                                                            std::nullopt, /*enable_gqa=*/true);
  EXPECT_GT(relative_error(bf16.to(at::kFloat), whole), 0.1);
}

// Under bf16 autocast the model runs the documents in bf16, near its fp32 loss, and trains.
TEST(DocumentMaskingBf16, LossUnderAutocastIsNearTheFp32Loss) {
  at::manual_seed(32);
  Llama model(tiny_config(), Kernels::fused_cpu);
  const PackedWindow window = mixed_window();
  const PackedDocuments documents = pack_documents(window.tokens, kEnd);
  const double fp32 = model->loss(window.tokens, window.targets, &documents).item<double>();
  at::Tensor bf16;
  {
    const AutocastGuard autocast(at::kCPU, /*enabled=*/true);
    bf16 = model->loss(window.tokens, window.targets, &documents);
  }
  bf16.backward();
  EXPECT_NEAR(bf16.item<double>(), fp32, 1e-2 * fp32);
  EXPECT_TRUE(model->token_embeddings->weight.grad().isfinite().all().item<bool>());
}

TEST(DocumentMaskingShapes, RefusesDocumentsOfOtherTokensAndWindowsBeyondMaxSeqLen) {
  Llama model(tiny_config(), Kernels::fused_cpu);
  const at::Tensor tokens = at::randint(50, {2, 8});
  EXPECT_THROW(model->forward_packed(tokens, pack_documents(tokens.narrow(1, 0, 7), kEnd)),
               c10::Error);
  const at::Tensor too_long = at::randint(50, {1, tiny_config().max_seq_len + 1});
  EXPECT_THROW(model->forward_packed(too_long, pack_documents(too_long, kEnd)), std::exception);
}

}  // namespace
}  // namespace mltrain
