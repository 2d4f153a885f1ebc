// The C++ model against the independent Python reference in tests/reference/: same weights (through
// a .safetensors file the reference reads with Hugging Face's own safetensors package), same batch;
// logits, loss and every gradient must agree to a relative error of 1e-5 in fp32, through the loss
// that training computes (Llama::loss), with mltrain's fused kernels and with the plain ATen
// layers, on plain windows and on windows of packed documents.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "model/interop/hf_state_dict.h"
#include "model/kernels/kernels.h"
#include "model/layers/llama.h"
#include "model/layers/packed_documents.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::relative_error;

std::string config_json(const ModelConfig& c) {
  return fmt::format(
      R"({{"n_layers": {}, "n_q_heads": {}, "n_kv_heads": {}, "head_dim": {}, "norm_eps": {}, "rope_theta": {}}})",
      c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, c.norm_eps, c.rope_theta);
}

// With end_of_document, the window is read as packed documents (data.document_masking): row 0
// begins mid-document and holds three more, row 1 is one document after its end-of-document token.
void expect_parity_with_reference(const ModelConfig& config, Kernels kernels,
                                  std::optional<int64_t> end_of_document = std::nullopt) {
  testing::TemporaryDirectory dir;
  at::manual_seed(42);
  Llama model(config, kernels);
  const at::Tensor window = at::randint(config.vocab_size, {2, 33});
  if (end_of_document) {
    window.masked_fill_(window == *end_of_document, *end_of_document + 1);
    for (const auto& [row, column] : {std::pair{0, 6}, {0, 7}, {0, 20}, {1, 0}})
      window[row][column] = *end_of_document;
  }
  const at::Tensor tokens = window.narrow(1, 0, 32).contiguous();
  const at::Tensor targets = window.narrow(1, 1, 32).contiguous();

  std::optional<PackedDocuments> documents;
  if (end_of_document) documents = pack_documents(tokens, *end_of_document);
  const at::Tensor logits = documents ? model->forward_packed(tokens, *documents) : model(tokens);
  const at::Tensor loss = model->loss(tokens, targets, documents ? &*documents : nullptr);
  loss.backward();

  testing::write_text(dir / "config.json", config_json(config));
  save_model_weights(model, dir / "weights.safetensors");
  NamedTensors batch = {{"tokens", tokens}, {"targets", targets}};
  if (end_of_document) batch["end_of_document"] = at::tensor({*end_of_document}, at::kLong);
  save_safetensors(dir / "batch.safetensors", batch);
  const std::string command =
      fmt::format("{} {}/tests/reference/parity.py {} {} {} {}", MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR,
                  (dir / "config.json").string(), (dir / "weights.safetensors").string(),
                  (dir / "batch.safetensors").string(), (dir / "out.safetensors").string());
  const testing::CommandResult run = testing::run_command(command);
  ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.output;

  const NamedTensors reference = load_safetensors(dir / "out.safetensors");
  EXPECT_LE(relative_error(logits, reference.at("logits")), 1e-5);
  EXPECT_LE(relative_error(loss.reshape({1}), reference.at("loss")), 1e-5);
  size_t outputs = 2;
  if (end_of_document) {
    // In the reference too, each document's logits are those it has alone.
    EXPECT_LE(relative_error(reference.at("logits"), reference.at("logits_alone")), 1e-5);
    ++outputs;
  }
  // Every Hugging Face tensor's gradient: each projection's rows of a fused parameter's.
  size_t compared = 0;
  for (const NamedParameter& parameter : hf_parameters(model)) {
    ASSERT_TRUE(parameter.tensor.grad().defined()) << parameter.name;
    for (const ParameterPart& part : parameter.parts) {
      EXPECT_LE(
          relative_error(part_of(parameter.tensor.grad(), part), reference.at("grad." + part.name)),
          1e-5)
          << part.name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, reference.size() - outputs);
}

ModelConfig untied_config() {
  ModelConfig config;
  config.n_layers = 2;
  config.tie_word_embeddings = false;
  return config;
}

TEST(ReferenceParity, BaseModelMatchesThePythonReference) {
  expect_parity_with_reference(ModelConfig{}, Kernels::fused_cpu);
}

TEST(ReferenceParity, BaseModelOnTheAtenLayersMatchesThePythonReference) {
  expect_parity_with_reference(ModelConfig{}, Kernels::aten);
}

TEST(ReferenceParity, UntiedModelMatchesThePythonReference) {
  expect_parity_with_reference(untied_config(), Kernels::fused_cpu);
}

TEST(ReferenceParity, UntiedModelOnTheAtenLayersMatchesThePythonReference) {
  expect_parity_with_reference(untied_config(), Kernels::aten);
}

TEST(ReferenceParity, PackedDocumentsMatchThePythonReference) {
  expect_parity_with_reference(ModelConfig{}, Kernels::fused_cpu, /*end_of_document=*/2);
}

TEST(ReferenceParity, PackedDocumentsOnTheAtenLayersMatchThePythonReference) {
  expect_parity_with_reference(ModelConfig{}, Kernels::aten, /*end_of_document=*/2);
}

}  // namespace
}  // namespace mltrain
