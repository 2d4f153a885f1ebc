#include "data/bpe_encoder.h"

#include <gtest/gtest.h>

#include "data/document_reader.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// Real text from Debian packages that setup.sh installs: English and Chinese fortunes.
const std::vector<std::filesystem::path> kFortunes = {"/usr/share/games/fortunes/computers",
                                                      "/usr/share/games/fortunes/tang300"};

Tokenizer trained_tokenizer(const std::filesystem::path& model,
                            const std::vector<std::string>& text, int64_t vocab_size) {
  train_tokenizer(text, vocab_size, /*threads=*/2, model);
  return Tokenizer(model);
}

// SentencePiece itself is the reference: every document of English and Chinese fortunes, and
// texts that lean on spaces, digits, bytes and the space mark, give its ids exactly.
TEST(BpeEncoder, GivesSentencePiecesIdsForEveryDocument) {
  TemporaryDirectory dir;
  const std::vector<std::string> documents = read_documents(kFortunes, DocumentFormat::kFortune);
  const Tokenizer tokenizer = trained_tokenizer(dir / "model", documents, 1500);
  const std::optional<BpeEncoder> encoder = BpeEncoder::for_model(tokenizer);
  ASSERT_TRUE(encoder.has_value()) << "a model mlprep trains is one the encoder reproduces";
  std::vector<std::string> texts = documents;
  for (const char* text : {"", " ", "   ", "a  b   c", " \xE2\x96\x81 x \xE2\x96\x81\xE2\x96\x81y",
                           "123 4567 89", "\t\n\r", "trailing  ", "\xF0\x9F\x8E\x89 party 春"})
    texts.emplace_back(text);
  size_t differing = 0;
  for (const std::string& text : texts) {
    // Twice, the second through the cache.
    EXPECT_EQ(encoder->encode(text), tokenizer.encode(text)) << text;
    if (encoder->encode(text) != tokenizer.encode(text)) ++differing;
  }
  EXPECT_EQ(differing, 0u) << "of " << texts.size();
}

// SentencePiece repairs text that is not UTF-8 before it encodes it: such text goes to it.
TEST(BpeEncoder, TextThatIsNotUtf8GetsSentencePiecesIds) {
  TemporaryDirectory dir;
  const Tokenizer tokenizer = trained_tokenizer(
      dir / "model", read_documents({kFortunes[0]}, DocumentFormat::kFortune), 600);
  const std::optional<BpeEncoder> encoder = BpeEncoder::for_model(tokenizer);
  ASSERT_TRUE(encoder.has_value());
  for (const std::string text : {"latin-1 caf\xE9 here", "cut \xE4\xB8", "\xFF\xFE bytes", "\x80"})
    EXPECT_EQ(encoder->encode(text), tokenizer.encode(text)) << text;
}

// Each thread caches segments per encoder: two models in one thread never see each other's.
TEST(BpeEncoder, TwoModelsInOneThreadKeepTheirOwnIds) {
  TemporaryDirectory dir;
  const std::vector<std::string> documents =
      read_documents({kFortunes[0]}, DocumentFormat::kFortune);
  const Tokenizer small = trained_tokenizer(dir / "small", documents, 400);
  const Tokenizer large = trained_tokenizer(dir / "large", documents, 900);
  const std::optional<BpeEncoder> small_encoder = BpeEncoder::for_model(small);
  const std::optional<BpeEncoder> large_encoder = BpeEncoder::for_model(large);
  ASSERT_TRUE(small_encoder && large_encoder);
  const std::string text = "The computer is down again, and the programmers are debugging.";
  ASSERT_NE(small.encode(text), large.encode(text));
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(small_encoder->encode(text), small.encode(text));
    EXPECT_EQ(large_encoder->encode(text), large.encode(text));
  }
}

}  // namespace
}  // namespace mltrain
