#include "data/corpus_prep.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "data/shard.h"
#include "data/token_windows.h"
#include "data/tokenizer.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// Real text from Debian packages that setup.sh installs: English and Chinese fortunes.
const std::vector<std::filesystem::path> kFortunes = {"/usr/share/games/fortunes/computers",
                                                      "/usr/share/games/fortunes/tang300"};

// The documents of a split: its shards' tokens cut at each end-of-document token and decoded.
std::vector<std::string> decode_split(const std::filesystem::path& dir, const std::string& split,
                                      const Tokenizer& tokenizer) {
  std::vector<std::string> documents;
  std::vector<int> current;
  for (const std::string& path : expand_glob((dir / (split + "_*.bin")).string())) {
    const ShardReader shard(path, tokenizer.vocab_size());
    std::vector<int64_t> tokens(shard.num_tokens());
    shard.read(0, tokens);
    for (const int64_t token : tokens) {
      if (token == tokenizer.end_of_document()) {
        documents.push_back(tokenizer.decode(current));
        current.clear();
      } else {
        current.push_back(static_cast<int>(token));
      }
    }
  }
  EXPECT_TRUE(current.empty()) << "every document ends with the end-of-document token";
  return documents;
}

TEST(CorpusPrep, ShardsDecodeToTheInputDocuments) {
  TemporaryDirectory dir;
  CorpusPrepOptions options;
  options.inputs = kFortunes;
  options.format = DocumentFormat::kFortune;
  options.out_dir = dir / "out";
  options.vocab_size = 1500;
  options.val_fraction = 0.1;
  options.shard_tokens = 20000;  // several shards, documents cut across them
  options.threads = 2;
  const CorpusPrepReport report = prepare_corpus(options);

  const std::vector<std::string> documents = read_documents(kFortunes, DocumentFormat::kFortune);
  ASSERT_GT(documents.size(), 500u);
  EXPECT_EQ(report.val_documents, std::llround(0.1 * documents.size()));
  EXPECT_EQ(report.train_documents + report.val_documents, static_cast<int64_t>(documents.size()));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "train_000002.bin"));

  const Tokenizer tokenizer(dir / "out" / "tokenizer.model");
  EXPECT_EQ(tokenizer.vocab_size(), 1500);
  std::vector<std::string> decoded = decode_split(dir / "out", "train", tokenizer);
  const std::vector<std::string> val = decode_split(dir / "out", "val", tokenizer);
  EXPECT_EQ(static_cast<int64_t>(val.size()), report.val_documents);
  decoded.insert(decoded.end(), val.begin(), val.end());
  std::vector<std::string> expected = documents;
  std::sort(decoded.begin(), decoded.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(decoded, expected);
}

TEST(CorpusPrep, ReadsTheThreeDocumentFormats) {
  TemporaryDirectory dir;
  testing::write_text(dir / "a.txt", "first doc\nline two\n\n\nsecond doc\n");
  testing::write_text(dir / "b.txt", "a whole file\n");
  EXPECT_EQ(read_documents({dir / "a.txt", dir / "b.txt"}, DocumentFormat::kText),
            (std::vector<std::string>{"first doc\nline two", "second doc", "a whole file"}));
  testing::write_text(dir / "c.jsonl",
                      "{\"text\": \"one\\ntwo\", \"id\": 1}\n\n{\"text\": \"three\"}\n");
  EXPECT_EQ(read_documents({dir / "c.jsonl"}, DocumentFormat::kJsonl),
            (std::vector<std::string>{"one\ntwo", "three"}));
  testing::write_text(dir / "d", "A fortune.\n%\nAnother,\n  \x1b[33mindented\x1b[m.\n%\n");
  EXPECT_EQ(read_documents({dir / "d"}, DocumentFormat::kFortune),
            (std::vector<std::string>{"A fortune.", "Another,\n  indented."}));
}

TEST(CorpusPrep, BadInputsAreNamed) {
  TemporaryDirectory dir;
  testing::write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  try {
    read_documents({dir / "bad.jsonl"}, DocumentFormat::kJsonl);
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "bad.jsonl:2: expected a JSON object with a \"text\" string");
  }
  try {
    read_documents({dir / "missing.txt"}, DocumentFormat::kText);
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "missing.txt: cannot read the input file");
  }
  try {
    Tokenizer tokenizer(dir / "absent.model");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "absent.model: tokenizer model not found");
  }
  testing::write_text(dir / "garbage.model", "not a model");
  EXPECT_THROW(Tokenizer(dir / "garbage.model"), UserError);
}

}  // namespace
}  // namespace mltrain
