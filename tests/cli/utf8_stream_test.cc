// cli::Utf8Stream (issue 47): `cohort generate` writes whole UTF-8 characters as tokens arrive; a
// character split over tokens is held until its last byte, and bytes that are not UTF-8 pass at once.
#include "cli/utf8_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cohort::cli {
namespace {

// What each push returns, and finish() last.
std::vector<std::string> written(const std::vector<std::string>& pieces) {
  Utf8Stream s;
  std::vector<std::string> out;
  for (const std::string& p : pieces) out.emplace_back(s.push(p));
  out.emplace_back(s.finish());
  return out;
}

TEST(Utf8StreamTest, ACharacterSplitOverTokensIsWrittenWithItsLastByte) {
  // "é" (C3 A9), "€" (E2 82 AC), "😀" (F0 9F 98 80) cut everywhere.
  EXPECT_EQ(written({"a\xc3", "\xa9!"}), (std::vector<std::string>{"a", "\xc3\xa9!", ""}));
  EXPECT_EQ(written({"\xe2", "\x82", "\xac"}), (std::vector<std::string>{"", "", "\xe2\x82\xac", ""}));
  EXPECT_EQ(written({"x\xf0\x9f", "\x98", "\x80y"}), (std::vector<std::string>{"x", "", "\xf0\x9f\x98\x80y", ""}));
  EXPECT_EQ(written({"\xf0\x9f\x98\x80"}), (std::vector<std::string>{"\xf0\x9f\x98\x80", ""}));
}

TEST(Utf8StreamTest, BytesThatCannotBecomeACharacterPassAtOnce) {
  // A stray continuation byte, a lead byte followed by ASCII, 0xFF: written as they come.
  EXPECT_EQ(written({"\x80", "a"}), (std::vector<std::string>{"\x80", "a", ""}));
  EXPECT_EQ(written({"\xc3", "a"}), (std::vector<std::string>{"", "\xc3" "a", ""}));
  EXPECT_EQ(written({"\xff"}), (std::vector<std::string>{"\xff", ""}));
  // A text that ends inside a character: finish() gives what was held.
  EXPECT_EQ(written({"ok\xe2\x82"}), (std::vector<std::string>{"ok", "\xe2\x82"}));
}

TEST(Utf8StreamTest, CompletePrefix) {
  EXPECT_EQ(completeUtf8Prefix(""), 0u);
  EXPECT_EQ(completeUtf8Prefix("abc"), 3u);
  EXPECT_EQ(completeUtf8Prefix("ab\xc3"), 2u);
  EXPECT_EQ(completeUtf8Prefix("ab\xc3\xa9"), 4u);
  EXPECT_EQ(completeUtf8Prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(completeUtf8Prefix("\x9f\x98\x80"), 3u);  // continuation bytes alone: nothing to wait for
}

}  // namespace
}  // namespace cohort::cli
