#include "model/interop/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "model/interop/hf_state_dict.h"
#include "model/interop/weight_files.h"
#include "tests/model/tiny_config.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::read_text;
using testing::TemporaryDirectory;
using testing::write_text;

// A .safetensors file assembled by hand from a header and data, as the format describes it.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  std::string bytes(reinterpret_cast<const char*>(&length), sizeof(length));
  return bytes + header + data;
}

// Runs load_safetensors and returns its UserError message ("" when it loaded).
std::string load_error(const std::filesystem::path& path) {
  try {
    load_safetensors(path);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(Safetensors, RoundTripKeepsNamesDtypesShapesAndValues) {
  TemporaryDirectory dir;
  at::manual_seed(0);
  const NamedTensors tensors = {
      {"a.f32", at::randn({3, 4})},
      {"b.bf16", at::randn({5}).to(at::kBFloat16)},
      {"c.f16", at::randn({2, 2, 2}).to(at::kHalf)},
      {"d.i64", at::arange(7, at::kLong)},
      {"e.scalar", at::tensor(3.5)},
      {"f.empty", at::empty({0, 3})},
      {"g.strided", at::randn({4, 6}).t()},  // non-contiguous input
  };
  save_safetensors(dir / "t.safetensors", tensors, {{"format", "pt"}});
  const NamedTensors loaded = load_safetensors(dir / "t.safetensors");
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_TRUE(loaded.contains(name)) << name;
    EXPECT_EQ(loaded.at(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(at::equal(loaded.at(name), tensor)) << name;
  }
}

TEST(Safetensors, FileFollowsTheFormat) {
  TemporaryDirectory dir;
  save_safetensors(dir / "t.safetensors", {{"x", at::tensor({1.0f, 2.0f})}});
  const std::string bytes = read_text(dir / "t.safetensors");
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  ASSERT_EQ(bytes.size(), 8 + header_length + 8);
  EXPECT_EQ(header_length % 8, 0u) << "data is 8-byte aligned";
  const auto header = nlohmann::json::parse(bytes.substr(8, header_length));
  EXPECT_EQ(header["x"]["dtype"], "F32");
  EXPECT_EQ(header["x"]["shape"], nlohmann::json::array({2}));
  EXPECT_EQ(header["x"]["data_offsets"], nlohmann::json::array({0, 8}));
  float values[2];
  std::memcpy(values, bytes.data() + 8 + header_length, 8);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);
}

// Files that several writers fill piece by piece, as the ranks of a sharded run write a
// checkpoint: cut at random places, written in another order by three writers, the pieces make
// the same bytes as save_safetensors writes at once, and the file loads back whole.
TEST(Safetensors, PiecesFromSeveralWritersMakeTheFileSaveSafetensorsWrites) {
  TemporaryDirectory dir;
  at::manual_seed(1);
  const NamedTensors tensors = {{"b.weight", at::randn({7, 5})},
                                {"a.bias", at::randn({11})},
                                {"c.step", at::tensor(4.0f)},
                                {"d.half", at::randn({3, 3}).to(at::kHalf)}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  save_safetensors(dir / "at_once.safetensors", tensors, metadata);

  const SafetensorsShare whole = whole_share(tensors);
  const SafetensorsLayout layout(whole.entries, metadata);
  create_safetensors(dir / "pieces.safetensors", layout);
  std::vector<std::vector<TensorPiece>> writers(3);
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor flat = tensor.flatten();
    for (int64_t first = 0, writer = 0; first < flat.numel(); ++writer) {
      const int64_t count =
          std::min<int64_t>(flat.numel() - first, 1 + at::randint(4, {1}).item<int64_t>());
      writers[writer % 3].push_back({name, first, flat.narrow(0, first, count)});
      first += count;
    }
  }
  for (auto writer = writers.rbegin(); writer != writers.rend(); ++writer)
    write_safetensors_pieces(dir / "pieces.safetensors", layout, *writer);

  EXPECT_EQ(read_text(dir / "pieces.safetensors"), read_text(dir / "at_once.safetensors"));
  const NamedTensors loaded = load_safetensors(dir / "pieces.safetensors");
  for (const auto& [name, tensor] : tensors)
    EXPECT_TRUE(at::equal(loaded.at(name), tensor)) << name;
}

// A piece that does not fit its file is refused before anything of it is written: another name,
// another dtype, or elements past the tensor's end.
TEST(Safetensors, APieceThatDoesNotFitItsTensorIsRefused) {
  TemporaryDirectory dir;
  const SafetensorsLayout layout({{"w", at::kFloat, {2, 3}}});
  create_safetensors(dir / "t.safetensors", layout);
  const std::string before = read_text(dir / "t.safetensors");
  const std::vector<std::pair<TensorPiece, std::string>> misfits = {
      {{"v", 0, at::ones({2})}, "no tensor 'v'"},
      {{"w", 0, at::ones({2}, at::kDouble)}, "does not fit tensor 'w'"},
      {{"w", 5, at::ones({2})}, "does not fit tensor 'w'"},
      {{"w", -1, at::ones({1})}, "does not fit tensor 'w'"}};
  for (const auto& [piece, message] : misfits) {
    try {
      write_safetensors_pieces(dir / "t.safetensors", layout, {piece});
      ADD_FAILURE() << "accepted " << piece.name << " at " << piece.first;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(read_text(dir / "t.safetensors"), before);
  EXPECT_THROW(SafetensorsLayout({{"w", at::kFloat, {1}}, {"w", at::kFloat, {2}}}),
               std::invalid_argument);
}

TEST(Safetensors, TruncatedFileNamesTheTensor) {
  TemporaryDirectory dir;
  save_safetensors(dir / "t.safetensors", {{"first", at::ones({4})}, {"second", at::ones({4})}});
  std::string bytes = read_text(dir / "t.safetensors");
  write_text(dir / "t.safetensors", bytes.substr(0, bytes.size() - 3));
  const std::string message = load_error(dir / "t.safetensors");
  EXPECT_NE(message.find("t.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("'second'"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  write_text(dir / "short.safetensors", bytes.substr(0, 5));
  EXPECT_NE(load_error(dir / "short.safetensors").find("truncated"), std::string::npos);
}

TEST(Safetensors, BadHeadersAreClearErrors) {
  TemporaryDirectory dir;
  const auto path = dir / "bad.safetensors";
  const std::string eight_bytes(8, '\0');

  write_text(path, safetensors_bytes("{not json", ""));
  EXPECT_NE(load_error(path).find("not valid JSON"), std::string::npos) << load_error(path);

  std::string huge_length(8, '\xff');
  write_text(path, huge_length + "{}");
  EXPECT_NE(load_error(path).find("header length"), std::string::npos) << load_error(path);

  write_text(path,
             safetensors_bytes(R"({"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})",
                               eight_bytes));
  EXPECT_NE(load_error(path).find("tensor 'w': unsupported dtype \"F33\""), std::string::npos)
      << load_error(path);

  write_text(path,
             safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                               eight_bytes));
  EXPECT_NE(load_error(path).find("tensor 'w': shape [3] of F32 needs 12 bytes"), std::string::npos)
      << load_error(path);

  write_text(path, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2]}})", eight_bytes));
  EXPECT_NE(load_error(path).find("tensor 'w'"), std::string::npos) << load_error(path);

  write_text(path,
             safetensors_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                               eight_bytes));
  EXPECT_NE(load_error(path).find("overlapping"), std::string::npos) << load_error(path);

  write_text(path,
             safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                               eight_bytes));
  EXPECT_NE(load_error(path).find("4 bytes of data follow the last tensor"), std::string::npos)
      << load_error(path);

  EXPECT_NE(load_error(dir / "missing.safetensors").find("cannot open"), std::string::npos);
}

// A shape whose byte count overflows 64 bits could pass for one of a few bytes ([2^62 + 32, 4] of
// F32 "needs" 512 bytes modulo 2^64): sizes are counted with overflow checks, and every number
// must be a non-negative integer.
TEST(Safetensors, ShapesAndOffsetsThatCannotBeCountedAreClearErrors) {
  TemporaryDirectory dir;
  const auto path = dir / "bad.safetensors";
  const std::string data(512, '\0');
  for (const auto& [entry, message] : std::vector<std::pair<std::string, std::string>>{
           {R"("shape": [4611686018427387936, 4], "data_offsets": [0, 512])",
            "tensor 'w': its shape has more elements than 64-bit sizes count"},
           {R"("shape": [0, 4611686018427387936, 4611686018427387936], "data_offsets": [0, 0])",
            "tensor 'w': its shape has more elements than 64-bit sizes count"},
           {R"("shape": [-1, 4], "data_offsets": [0, 512])",
            "tensor 'w': \"shape\" holds -1, not a non-negative integer"},
           {R"("shape": [2.5], "data_offsets": [0, 512])",
            "tensor 'w': \"shape\" holds 2.5, not a non-negative integer"},
           {R"("shape": "big", "data_offsets": [0, 512])",
            "tensor 'w': \"shape\" must be a list of integers"},
           {R"("shape": [128], "data_offsets": [-512, 0])",
            "tensor 'w': \"data_offsets\" holds -512, not a non-negative integer"}}) {
    write_text(path, safetensors_bytes(R"({"w": {"dtype": "F32", )" + entry + "}}", data));
    EXPECT_CONTAINS(load_error(path), message);
  }
  write_text(path, safetensors_bytes(R"({"w": 7})", data));
  EXPECT_CONTAINS(load_error(path), "tensor 'w': its entry must be a JSON object");
}

// Each parameter under the Hugging Face name of what it holds; its parts as (name, first row,
// rows).
using PartRows = std::vector<std::tuple<std::string, int64_t, int64_t>>;
std::map<std::string, PartRows> parts_by_parameter(const Llama& model) {
  std::map<std::string, PartRows> named;
  for (const NamedParameter& parameter : hf_parameters(model)) {
    for (const ParameterPart& part : parameter.parts)
      named[parameter.name].emplace_back(part.name, part.first_row, part.rows);
  }
  return named;
}

TEST(HfStateDict, NamesAreHuggingFaceLlamaNames) {
  // tiny_config: d_model 64, 4 query heads and 2 key/value heads of 16, d_ffn 96, 2 layers.
  const Llama model(testing::tiny_config(), Kernels::fused_cpu);
  const std::map<std::string, PartRows> named = parts_by_parameter(model);
  const auto whole = [](const std::string& name, int64_t rows) {
    return PartRows{{name, 0, rows}};
  };
  EXPECT_EQ(named.at("model.embed_tokens.weight"), whole("model.embed_tokens.weight", 97));
  EXPECT_EQ(named.at("model.norm.weight"), whole("model.norm.weight", 64));
  EXPECT_FALSE(named.contains("lm_head.weight"));
  for (const std::string layer : {"model.layers.0.", "model.layers.1."}) {
    for (const std::string name : {"input_layernorm.weight", "post_attention_layernorm.weight"})
      EXPECT_EQ(named.at(layer + name), whole(layer + name, 64));
    EXPECT_EQ(named.at(layer + "self_attn.o_proj.weight"),
              whole(layer + "self_attn.o_proj.weight", 64));
    EXPECT_EQ(named.at(layer + "mlp.down_proj.weight"), whole(layer + "mlp.down_proj.weight", 64));
    // Fused: q (4 x 16 rows), k and v (2 x 16 each); gate and up (96 each).
    EXPECT_EQ(named.at(layer + "self_attn.qkv_proj.weight"),
              (PartRows{{layer + "self_attn.q_proj.weight", 0, 64},
                        {layer + "self_attn.k_proj.weight", 64, 32},
                        {layer + "self_attn.v_proj.weight", 96, 32}}));
    EXPECT_EQ(named.at(layer + "mlp.gate_up_proj.weight"),
              (PartRows{{layer + "mlp.gate_proj.weight", 0, 96},
                        {layer + "mlp.up_proj.weight", 96, 96}}));
  }
  EXPECT_EQ(named.size(), 2 + 6 * 2u);

  ModelConfig untied = testing::tiny_config();
  untied.tie_word_embeddings = false;
  EXPECT_EQ(parts_by_parameter(Llama(untied, Kernels::fused_cpu)).at("lm_head.weight"),
            whole("lm_head.weight", 97));
}

// A Hugging Face projection's weight is the rows of the fused parameter that its part names,
// shared: what is loaded under its name lands in those rows, and the model computes with it.
TEST(HfStateDict, ProjectionsAreRowsOfTheFusedWeights) {
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  NamedTensors state = hf_state_dict(model);
  for (auto& [name, tensor] : state) tensor = at::randn_like(tensor);
  load_hf_state_dict(model, state, "weights.safetensors");
  const at::Tensor& qkv = model->layers[1]->attn->wqkv->weight;
  EXPECT_TRUE(at::equal(qkv.narrow(0, 0, 64), state.at("model.layers.1.self_attn.q_proj.weight")));
  EXPECT_TRUE(at::equal(qkv.narrow(0, 64, 32), state.at("model.layers.1.self_attn.k_proj.weight")));
  EXPECT_TRUE(at::equal(qkv.narrow(0, 96, 32), state.at("model.layers.1.self_attn.v_proj.weight")));
  const at::Tensor& gate_up = model->layers[0]->ffn->w_gate_up->weight;
  EXPECT_TRUE(at::equal(gate_up.narrow(0, 0, 96), state.at("model.layers.0.mlp.gate_proj.weight")));
  EXPECT_TRUE(at::equal(gate_up.narrow(0, 96, 96), state.at("model.layers.0.mlp.up_proj.weight")));
  // The state dict's tensors are views into the parameters, not copies.
  EXPECT_EQ(hf_state_dict(model).at("model.layers.1.self_attn.k_proj.weight").data_ptr(),
            qkv.narrow(0, 64, 32).data_ptr());
}

TEST(HfStateDict, TiedModelOmitsLmHead) {
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  const NamedTensors state = hf_state_dict(model);
  EXPECT_FALSE(state.contains("lm_head.weight"));
  EXPECT_EQ(state.size(), 2 + 9 * 2u);  // 9 Hugging Face tensors in each of 2 blocks
}

TEST(HfStateDict, ModelWeightsRoundTrip) {
  TemporaryDirectory dir;
  at::manual_seed(1);
  Llama saved(testing::tiny_config(), Kernels::fused_cpu);
  save_model_weights(saved, dir / "model.safetensors");
  at::manual_seed(2);
  Llama loaded(testing::tiny_config(), Kernels::fused_cpu);
  ASSERT_FALSE(at::equal(loaded->layers[1]->ffn->w_gate_up->weight,
                         saved->layers[1]->ffn->w_gate_up->weight));
  load_model_weights(loaded, dir / "model.safetensors");
  for (const auto& [name, tensor] : hf_state_dict(saved)) {
    EXPECT_TRUE(at::equal(hf_state_dict(loaded).at(name), tensor)) << name;
  }
}

std::string load_into_tiny_model(const NamedTensors& tensors) {
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  try {
    load_hf_state_dict(model, tensors, "weights.safetensors");
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(HfStateDict, MismatchesNameEveryOffendingKey) {
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  NamedTensors state = hf_state_dict(model);
  EXPECT_EQ(load_into_tiny_model(state), "");

  NamedTensors wrong = state;
  wrong["model.layers.1.mlp.up_proj.weight"] = at::zeros({96, 65});
  wrong.erase("model.norm.weight");
  wrong["model.layers.0.self_attn.q_proj.weight"] = at::zeros({64, 64}, at::kLong);
  wrong["lm_head.weight"] = at::zeros({97, 64});
  const std::string message = load_into_tiny_model(wrong);
  EXPECT_NE(message.find("weights.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("model.layers.1.mlp.up_proj.weight has shape [96, 65] in the file, [96, "
                         "64] in the model"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("missing model.norm.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("model.layers.0.self_attn.q_proj.weight has non-floating dtype"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("unexpected lm_head.weight"), std::string::npos) << message;
}

TEST(HfStateDict, FailedLoadLeavesTheModelUnchanged) {
  at::manual_seed(3);
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  const at::Tensor before = model->layers[0]->attn->wqkv->weight.clone();
  at::manual_seed(4);  // other weights than the model's, so that a partial copy would show
  NamedTensors state = hf_state_dict(Llama(testing::tiny_config(), Kernels::fused_cpu));
  state.erase("model.norm.weight");
  EXPECT_THROW(load_hf_state_dict(model, state, "x"), UserError);
  EXPECT_TRUE(at::equal(model->layers[0]->attn->wqkv->weight, before));
}

// Read from a file a tensor at a time, the weights of some parameters land in them and no other
// changes (ZeRO-3 loads a unit at a time); a file that does not match the whole model changes
// nothing, whichever parameters were asked for.
TEST(HfStateDict, WeightsOfSomeParametersAreReadFromAFileAlone) {
  TemporaryDirectory dir;
  at::manual_seed(4);
  Llama saved(testing::tiny_config(), Kernels::fused_cpu);
  save_model_weights(saved, dir / "model.safetensors");
  at::manual_seed(5);
  Llama model(testing::tiny_config(), Kernels::fused_cpu);
  std::vector<at::Tensor> before;
  for (const at::Tensor& parameter : model->parameters()) before.push_back(parameter.clone());
  const at::Tensor& wanted = model->layers[1]->attn->wqkv->weight;
  load_hf_weights(model, WeightFiles(dir / "model.safetensors"), {wanted});
  EXPECT_TRUE(at::equal(wanted, saved->layers[1]->attn->wqkv->weight));
  const std::vector<at::Tensor> after = model->parameters();
  int changed = 0;
  for (size_t k = 0; k < after.size(); ++k) changed += at::equal(after[k], before[k]) ? 0 : 1;
  EXPECT_EQ(changed, 1);

  NamedTensors state = hf_state_dict(saved);
  state.erase("model.norm.weight");
  save_state_dict(state, dir / "short.safetensors");
  const at::Tensor& other = model->layers[0]->ffn->w_down->weight;
  const at::Tensor other_before = other.clone();
  try {
    load_hf_weights(model, WeightFiles(dir / "short.safetensors"), {other});
    ADD_FAILURE() << "a file without model.norm.weight loaded";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "short.safetensors does not match the model");
    EXPECT_CONTAINS(std::string(error.what()), "missing model.norm.weight");
  }
  EXPECT_TRUE(at::equal(other, other_before));
}

}  // namespace
}  // namespace mltrain
