// Text streamed token by token: every piece handed out is whole UTF-8 characters, and together
// they are the text, including characters that byte fallback spells as several tokens.
#include "data/text_stream.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "data/corpus_prep.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

// Whether `text` is a sequence of complete UTF-8 characters with no replacement character.
bool whole_characters(const std::string& text) {
  if (text.find("\xEF\xBF\xBD") != std::string::npos) return false;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if ((lead & 0xC0) == 0x80 || i + length > text.size()) return false;
    for (size_t j = i + 1; j < i + length; ++j) {
      if ((static_cast<unsigned char>(text[j]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

TEST(TextStream, HandsOutWholeCharactersThatMakeTheText) {
  testing::TemporaryDirectory dir;
  const std::vector<std::string> documents =
      read_documents({"/usr/share/games/fortunes/computers", "/usr/share/games/fortunes/tang300"},
                     DocumentFormat::kFortune);
  train_tokenizer(documents, /*vocab_size=*/1500, /*threads=*/2, dir / "tokenizer.model");
  const Tokenizer tokenizer(dir / "tokenizer.model");
  // Common and rare Chinese, an emoji and English: the rare ones come as byte pieces.
  const std::string text =
      "\xE7\x99\xBD\xE6\x97\xA5 \xE9\xBE\x98\xF0\x9F\x98\x80 and \xE4\xBE\x9D\xE5\xB1\xB1!";
  const std::vector<uint32_t> tokens = tokenizer.encode(text);
  const std::vector<Tokenizer::Piece> pieces = tokenizer.pieces();
  ASSERT_GE(
      std::count_if(tokens.begin(), tokens.end(),
                    [&](uint32_t id) { return pieces[id].kind == Tokenizer::PieceKind::byte; }),
      7)
      << "the rare character and the emoji should be spelt in bytes";

  TextStream stream(tokenizer);
  std::string streamed;
  for (const uint32_t token : tokens) {
    const std::string piece = stream.add(token);
    EXPECT_TRUE(whole_characters(piece)) << "after token " << token << ": " << piece;
    streamed += piece;
  }
  EXPECT_EQ(stream.add(tokenizer.end_of_document()), "");
  streamed += stream.finish();
  EXPECT_EQ(streamed, text);
}

TEST(TextStream, KnowsWhereACharacterIsIncomplete) {
  EXPECT_FALSE(ends_mid_character(""));
  EXPECT_FALSE(ends_mid_character("abc"));
  EXPECT_FALSE(ends_mid_character("\xE7\x99\xBD"));      // one whole 3-byte character
  EXPECT_TRUE(ends_mid_character("a\xE7\x99"));          // two of its three bytes
  EXPECT_TRUE(ends_mid_character("a\xF0"));              // the lead of a 4-byte one
  EXPECT_TRUE(ends_mid_character("ab\xEF\xBF\xBD"));     // decoding's replacement character
  EXPECT_FALSE(ends_mid_character("\xF0\x9F\x98\x80"));  // a whole emoji
}

}  // namespace
}  // namespace mltrain
