// printable(): bytes that came from outside (a data file, a peer) made safe to quote in an error
// message, which ends up on a terminal or in a log: a stray 0xff must not leave invalid UTF-8 in
// the log, and an ESC must not reach the terminal as a control sequence.
//
// Kept as they are: printable ASCII (0x20..0x7e) and well-formed UTF-8 sequences (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF) of code points from U+00A0 on. Every other
// byte is written as \xNN (two lowercase hex digits): ASCII controls (tab and newline included),
// DEL, bytes of malformed or truncated sequences (one at a time; decoding resumes at the next byte)
// and the two bytes of a C1 control (U+0080..U+009F, which some terminals obey like ESC [). A
// backslash is written as \\ so that an escape in the output always means a byte of the input.
// Text longer than maxBytes is cut at the last whole character within its first maxBytes bytes and
// ends in "... (N bytes)" with the full length; pass std::string::npos for no limit.
// Thread safety: a pure function.
//
//   COHORT_THROW(IoError) << path << ":" << line << ": '" << runtime::printable(field)
//                         << "' is not a number";   // '\xff\xfe1' for the bytes ff fe 31
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cohort::runtime {

namespace printable_detail {

// The length of the well-formed UTF-8 sequence of a code point >= U+00A0 that starts at text[i],
// or 0 when there is none (Unicode's table 3-7 of well-formed byte sequences).
inline size_t utf8SequenceLength(std::string_view text, size_t i) {
  auto byteAt = [&](size_t k) { return k < text.size() ? static_cast<unsigned char>(text[k]) : 0u; };
  auto continues = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) { return byteAt(k) >= lo && byteAt(k) <= hi; };
  const unsigned lead = byteAt(i);
  if (lead == 0xc2) return continues(i + 1, 0xa0) ? 2 : 0;  // c2 80..9f: the C1 controls
  if (lead >= 0xc3 && lead <= 0xdf) return continues(i + 1) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {  // e0: no overlong forms; ed: no surrogates
    const bool ok = continues(i + 1, lead == 0xe0 ? 0xa0 : 0x80, lead == 0xed ? 0x9f : 0xbf) && continues(i + 2);
    return ok ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {  // f0: no overlong forms; f4: nothing above U+10FFFF
    const bool ok = continues(i + 1, lead == 0xf0 ? 0x90 : 0x80, lead == 0xf4 ? 0x8f : 0xbf) && continues(i + 2) &&
                    continues(i + 3);
    return ok ? 4 : 0;
  }
  return 0;
}

}  // namespace printable_detail

// `text` as the contract at the top of this file describes it.
inline std::string printable(std::string_view text, size_t maxBytes = 64) {
  static constexpr char kHex[] = "0123456789abcdef";
  const bool cut = text.size() > maxBytes;
  std::string out;
  for (size_t i = 0; i < text.size();) {
    // A well-formed multi-byte character is kept whole; every other byte is looked at on its own.
    const auto byte = static_cast<unsigned char>(text[i]);
    const size_t character = byte >= 0x80 ? printable_detail::utf8SequenceLength(text, i) : 0;
    const size_t take = character > 0 ? character : 1;
    if (cut && i + take > maxBytes) break;
    if (character > 0) {
      out.append(text.substr(i, character));
    } else if (byte == '\\') {
      out += "\\\\";
    } else if (byte >= 0x20 && byte < 0x7f) {
      out += static_cast<char>(byte);
    } else {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
    i += take;
  }
  if (cut) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace cohort::runtime
