// printable(): printable ASCII and well-formed UTF-8 pass, every other byte becomes \xNN (malformed,
// overlong, surrogate, truncated and C1 sequences, controls), a backslash becomes \\, and long text is
// cut at a character boundary with its length noted.
#include "runtime/printable.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace cohort::runtime {
namespace {

TEST(Printable, KeepsPrintableAsciiAndWellFormedUtf8) {
  EXPECT_EQ(printable(""), "");
  EXPECT_EQ(printable("1.5e3, abc ~!"), "1.5e3, abc ~!");
  for (const char* text :
       {"caf\xc3\xa9", "\xc2\xa0nbsp", "\xe6\x97\xa5\xe6\x9c\xac", "\xef\xbf\xbd", "\xf0\x9f\x98\x80",
        "\xf4\x8f\xbf\xbf"}) {  // U+00E9, U+00A0, 日本, U+FFFD, U+1F600, U+10FFFF
    EXPECT_EQ(printable(text), text);
  }
}

TEST(Printable, EscapesEveryOtherSingleByte) {
  for (int b = 0; b < 256; ++b) {
    const std::string in(1, static_cast<char>(b));
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, "\\x%02x", b);
    const std::string expected = b == '\\' ? "\\\\" : (b >= 0x20 && b < 0x7f) ? in : escaped;
    EXPECT_EQ(printable(in), expected) << "byte " << b;
  }
}

TEST(Printable, EscapesMalformedUtf8ByteByByte) {
  EXPECT_EQ(printable("\xff\xfez"), R"(\xff\xfez)");
  EXPECT_EQ(printable("\x80z"), R"(\x80z)");                        // a continuation byte alone
  EXPECT_EQ(printable("\xc0\xaf"), R"(\xc0\xaf)");                  // overlong '/'
  EXPECT_EQ(printable("\xc1\xbf"), R"(\xc1\xbf)");                  // overlong U+007F
  EXPECT_EQ(printable("\xe0\x80\xaf"), R"(\xe0\x80\xaf)");          // overlong, 3 bytes
  EXPECT_EQ(printable("\xf0\x80\x80\xaf"), R"(\xf0\x80\x80\xaf)");  // overlong, 4 bytes
  EXPECT_EQ(printable("\xed\xa0\x80"), R"(\xed\xa0\x80)");          // the surrogate U+D800
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), R"(\xf4\x90\x80\x80)");  // U+110000, beyond Unicode
  EXPECT_EQ(printable("\xf5\x80\x80\x80"), R"(\xf5\x80\x80\x80)");
  // Truncated sequences, at the end and before other text; decoding resumes right after the lead.
  EXPECT_EQ(printable("\xe6\x97"), R"(\xe6\x97)");
  EXPECT_EQ(printable("\xe6\x97Z\xc3\xa9"), "\\xe6\\x97Z\xc3\xa9");
  EXPECT_EQ(printable("\xf0\x9f\x98"), R"(\xf0\x9f\x98)");
  EXPECT_EQ(printable("\xc3\xe6\x97\xa5"), "\\xc3\xe6\x97\xa5");  // a lead byte, then a whole character
}

TEST(Printable, EscapesControlCharacters) {
  EXPECT_EQ(printable("\x1b[31mred\x1b[0m"), R"(\x1b[31mred\x1b[0m)");
  EXPECT_EQ(printable(std::string("a\tb\nc\rd\0e", 9)), R"(a\x09b\x0ac\x0dd\x00e)");
  EXPECT_EQ(printable("\x7f"), R"(\x7f)");
  EXPECT_EQ(printable(std::string("\xc2\x9b") + "31m"), R"(\xc2\x9b31m)");  // the C1 control CSI, as UTF-8
  EXPECT_EQ(printable("\xc2\x85"), R"(\xc2\x85)");                          // NEL
  EXPECT_EQ(printable(R"(C:\x41)"), R"(C:\\x41)");                          // an escape always means a byte
}

TEST(Printable, CutsLongTextAtACharacterAndNotesTheLength) {
  EXPECT_EQ(printable(std::string(64, 'a')), std::string(64, 'a'));  // the default limit: 64 bytes
  EXPECT_EQ(printable(std::string(100, 'a')), std::string(64, 'a') + "... (100 bytes)");
  EXPECT_EQ(printable("abcdef", 3), "abc... (6 bytes)");
  EXPECT_EQ(printable("abc", 0), "... (3 bytes)");
  std::string accents;
  for (int i = 0; i < 40; ++i) accents += "\xc3\xa9";                  // 80 bytes
  EXPECT_EQ(printable(accents, 5), "\xc3\xa9\xc3\xa9... (80 bytes)");  // not half of the third
  EXPECT_EQ(printable(accents, 6), "\xc3\xa9\xc3\xa9\xc3\xa9... (80 bytes)");
  EXPECT_EQ(printable("\xff\xff\xff\xff", 2), R"(\xff\xff... (4 bytes))");  // counts input bytes
  EXPECT_EQ(printable(std::string(1000, 'x'), std::string::npos), std::string(1000, 'x'));
}

}  // namespace
}  // namespace cohort::runtime
