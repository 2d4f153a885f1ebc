// The exported Hugging Face tokenizer against mltrain's own: the same ids for every text, read by
// transformers' AutoTokenizer (an independent BPE implementation) in tests/reference/.
#include "data/hf_tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/corpus_prep.h"
#include "data/tokenizer.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

const std::vector<std::filesystem::path> kFortunes = {"/usr/share/games/fortunes/computers",
                                                      "/usr/share/games/fortunes/tang300"};

// Every 4th fortune, English and Chinese, and the texts where two BPE implementations most
// easily part: runs of spaces, leading and trailing spaces, digits, newlines and tabs, and
// characters outside the vocabulary that byte fallback spells out.
std::vector<std::string> sample_texts(const std::vector<std::string>& documents) {
  std::vector<std::string> texts;
  for (size_t i = 0; i < documents.size(); i += 4) texts.push_back(documents[i]);
  for (const char* text :
       {" leading space", "trailing space ", "many     spaces  between", "2026-12-03: 1234567",
        "line one\nline two\n\n\ttabbed", "emoji \xF0\x9F\x98\x80 and rare \xE9\xBE\x98 chars",
        "\xE7\x99\xBD\xE6\x97\xA5\xE4\xBE\x9D\xE5\xB1\xB1\xE7\x9B\xA1", "a", ""}) {
    texts.emplace_back(text);
  }
  return texts;
}

TEST(HfTokenizer, TransformersEncodesToTheSameIdsAndDecodesBack) {
  TemporaryDirectory dir;
  const std::vector<std::string> documents = read_documents(kFortunes, DocumentFormat::kFortune);
  train_tokenizer(documents, /*vocab_size=*/1500, /*threads=*/2, dir / "tokenizer.model");
  write_hf_tokenizer(dir / "tokenizer.model", dir / "hf");
  for (const char* file :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"})
    EXPECT_TRUE(std::filesystem::exists(dir / "hf" / file)) << file;

  const std::vector<std::string> texts = sample_texts(documents);
  testing::write_text(dir / "texts.json", nlohmann::json(texts).dump());
  const std::string command = fmt::format(
      "{} {}/tests/reference/hf_tokenizer.py {} {} {}", MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR,
      (dir / "hf").string(), (dir / "texts.json").string(), (dir / "out.json").string());
  const testing::CommandResult run = testing::run_command(command);
  ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  const nlohmann::json out = nlohmann::json::parse(testing::read_text(dir / "out.json"));
  ASSERT_EQ(out["ids"].size(), texts.size());

  const Tokenizer tokenizer(dir / "tokenizer.model");
  size_t differing = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<uint32_t> expected = tokenizer.encode(texts[i]);
    const auto ids = out["ids"][i].get<std::vector<uint32_t>>();
    if (ids != expected && differing++ < 5) ADD_FAILURE() << "ids differ for: " << texts[i];
    EXPECT_EQ(out["decoded"][i].get<std::string>(), texts[i]);
  }
  EXPECT_EQ(differing, 0u) << "of " << texts.size() << " texts";
}

TEST(HfTokenizer, AMissingModelIsNamed) {
  TemporaryDirectory dir;
  try {
    write_hf_tokenizer(dir / "absent.model", dir / "hf");
    FAIL() << "expected a UserError";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), (dir / "absent.model").string());
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "hf"));
}

}  // namespace
}  // namespace mltrain
