#include "common/utf8_text.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace mltrain {
namespace {

// RFC 3629's well-formed sequences pass, one of each length; everything its table leaves out is
// found at the byte where it begins.
TEST(Utf8Text, FindsTheFirstByteThatIsNotWellFormed) {
  EXPECT_EQ(invalid_utf8_at(""), std::nullopt);
  EXPECT_EQ(invalid_utf8_at("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"), std::nullopt);  // a é 中 😀
  EXPECT_EQ(invalid_utf8_at("\xF4\x8F\xBF\xBF"), std::nullopt);                       // U+10FFFF
  EXPECT_EQ(invalid_utf8_at("web\xFF"), 3u);
  EXPECT_EQ(invalid_utf8_at("ab\xC3"), 2u) << "cut short";
  EXPECT_EQ(invalid_utf8_at("\xC0\xAF"), 0u) << "overlong /";
  EXPECT_EQ(invalid_utf8_at("\xE0\x80\xAF"), 0u) << "overlong /";
  EXPECT_EQ(invalid_utf8_at("\xED\xA0\x80"), 0u) << "a surrogate";
  EXPECT_EQ(invalid_utf8_at("\xF4\x90\x80\x80"), 0u) << "past U+10FFFF";
  EXPECT_EQ(invalid_utf8_at("x\x80"), 1u) << "a continuation byte alone";
}

TEST(Utf8Text, PrintsBadBytesAsEscapesAndKeepsTheRest) {
  EXPECT_EQ(printable_utf8("w\xC3\xA9"
                           "b\xFF\xFE"),
            "w\xC3\xA9"
            "b\\xFF\\xFE");
}

TEST(Utf8Text, RequireNamesWhatIsNotUtf8) {
  EXPECT_NO_THROW(require_utf8("fine", "data.sources entry 1: name"));
  try {
    require_utf8("we\xFF", "data.sources entry 1: name");
    FAIL() << "accepted";
  } catch (const UserError& error) {
    EXPECT_EQ(std::string(error.what()),
              "data.sources entry 1: name is not valid UTF-8 (\"we\\xFF\", byte 3): it is written "
              "into JSON and YAML files, which hold Unicode text only");
  }
}

}  // namespace
}  // namespace mltrain
