#include "nn/tokenizer_files.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "runtime/error.h"

namespace cohort::nn {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr uint32_t kLlmcMagic = 20240328;
constexpr size_t kLlmcHeaderWords = 256;
constexpr char kNotATokenizer[] =
    "not a tokenizer file (llm.c's .bin, HuggingFace's tokenizer.json or vocab.json, tiktoken's .tiktoken)";

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) COHORT_THROW(IoError) << path << ": cannot open: " << std::strerror(errno);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) COHORT_THROW(IoError) << path << ": read failed";
  return bytes;
}

// The code point GPT-2's map gives `byte` (gpt2ByteToChar's rule).
uint32_t byteCodePoint(unsigned char byte) {
  auto own = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  if (own(byte)) return byte;
  uint32_t shifted = 0;
  for (int b = 0; b < byte; ++b) shifted += own(b) ? 0 : 1;
  return 0x100 + shifted;
}

// The inverse map: code point -> byte, -1 for a character GPT-2's map never writes.
std::array<int, 0x144> charToByteTable() {
  std::array<int, 0x144> table;
  table.fill(-1);
  for (int b = 0; b < 256; ++b) table[byteCodePoint(static_cast<unsigned char>(b))] = b;
  return table;
}

// A token as HuggingFace writes it (UTF-8 of GPT-2's characters) -> its bytes.
std::string tokenBytes(const std::string& path, const std::string& text) {
  static const std::array<int, 0x144> table = charToByteTable();
  std::string bytes;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    uint32_t cp = c;
    size_t length = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < text.size() && (text[i + 1] & 0xC0) == 0x80) cp = (c & 0x1Fu) << 6 | (text[i + 1] & 0x3Fu), length = 2;
    const int byte = (c < 0x80 || length == 2) && cp < table.size() ? table[cp] : -1;
    if (byte < 0) {
      COHORT_THROW(InvalidArgument) << path << ": token \"" << text << "\" holds a character outside GPT-2's byte map";
    }
    bytes += static_cast<char>(byte);
    i += length;
  }
  return bytes;
}

Vocabulary emptyVocabulary(const std::string& format, const std::string& path) {
  Vocabulary v;
  v.format = format;
  v.path = path;
  return v;
}

Json parseJson(const std::string& path, const std::string& bytes) {
  try {
    return Json::parse(bytes);
  } catch (const Json::exception& e) {
    COHORT_THROW(InvalidArgument) << path << ": not valid JSON: " << e.what();
  }
}

// HuggingFace's vocab (token text -> id) into v.tokens; every id below the largest must be present.
void takeVocab(const std::string& path, const Json& vocab, Vocabulary& v) {
  if (!vocab.is_object() || vocab.empty()) COHORT_THROW(InvalidArgument) << path << ": no vocabulary (token -> id) object";
  std::vector<bool> seen(vocab.size(), false);
  v.tokens.assign(vocab.size(), std::string());
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(vocab.size())) {
      COHORT_THROW(InvalidArgument) << path << ": token \"" << text << "\" has id " << id.dump() << ", not one of 0.."
                                    << vocab.size() - 1 << " (the " << vocab.size() << " tokens' ids)";
    }
    const size_t i = id.get<size_t>();
    if (seen[i]) COHORT_THROW(InvalidArgument) << path << ": id " << i << " is given to two tokens";
    seen[i] = true;
    v.tokens[i] = text == kEndOfText ? text : tokenBytes(path, text);
    if (text == kEndOfText) v.specialIds.push_back(static_cast<int64_t>(i));
  }
}

// Merges "a b" (or ["a", "b"]) in order: each joins two tokens into a token whose id is larger than
// the previous merge's, so merging by id is merging in the file's order.
void checkMerges(const std::string& path, const std::vector<std::pair<std::string, std::string>>& merges,
                 const Vocabulary& v) {
  std::unordered_map<std::string, int64_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<int64_t>(i));
  int64_t last = -1;
  for (size_t line = 0; line < merges.size(); ++line) {
    const std::string joined = tokenBytes(path, merges[line].first) + tokenBytes(path, merges[line].second);
    const auto it = ids.find(joined);
    if (it == ids.end()) {
      COHORT_THROW(InvalidArgument) << path << ": merge " << line + 1 << " (\"" << merges[line].first << " "
                                    << merges[line].second << "\") makes a token not in the vocabulary";
    }
    if (it->second <= last) {
      COHORT_THROW(InvalidArgument) << path << ": merge " << line + 1 << " makes id " << it->second
                                    << ", not above the previous merge's " << last
                                    << ": Cohort merges by id, so merges must be in id order";
    }
    last = it->second;
  }
}

std::pair<std::string, std::string> splitMerge(const std::string& path, const std::string& line, size_t number) {
  const size_t space = line.find(' ');
  if (space == std::string::npos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != line.npos) {
    COHORT_THROW(InvalidArgument) << path << ": merge " << number << " (\"" << line << "\") is not two tokens";
  }
  return {line.substr(0, space), line.substr(space + 1)};
}

Vocabulary readLlmc(const std::string& path, const std::string& bytes) {
  uint32_t header[kLlmcHeaderWords] = {};
  if (bytes.size() < sizeof(header)) {
    COHORT_THROW(InvalidArgument) << path << ": " << bytes.size() << " bytes, shorter than a tokenizer's header of "
                                  << sizeof(header);
  }
  std::memcpy(header, bytes.data(), sizeof(header));
  if (header[1] != 1 && header[1] != 2) {
    COHORT_THROW(InvalidArgument) << path << ": llm.c tokenizer of version " << header[1] << ", expected 1 or 2";
  }
  Vocabulary v = emptyVocabulary("llm.c", path);
  v.tokens.reserve(header[2]);
  size_t at = sizeof(header);
  for (uint32_t id = 0; id < header[2]; ++id) {
    const size_t length = at < bytes.size() ? static_cast<unsigned char>(bytes[at]) : 0;
    if (at >= bytes.size() || at + 1 + length > bytes.size()) {
      COHORT_THROW(InvalidArgument) << path << ": ends inside token " << id << " of the " << header[2]
                                    << " its header counts";
    }
    v.tokens.push_back(bytes.substr(at + 1, length));
    if (header[1] == 1 && v.tokens.back() == kEndOfText) v.eotId = id;
    at += 1 + length;
  }
  if (header[1] == 2) {
    if (header[3] >= header[2]) {
      COHORT_THROW(InvalidArgument) << path << ": end-of-text id " << header[3] << " is past its " << header[2]
                                    << " tokens";
    }
    v.eotId = header[3];
  }
  return v;
}

Vocabulary readTokenizerJson(const std::string& path, const Json& json) {
  const Json& model = json["model"];
  if (!model.is_object() || model.value("type", "BPE") != "BPE") {
    COHORT_THROW(InvalidArgument) << path << ": \"model\" is not a BPE model";
  }
  Vocabulary v = emptyVocabulary("tokenizer.json", path);
  takeVocab(path, model.value("vocab", Json()), v);
  std::vector<std::pair<std::string, std::string>> merges;
  for (const Json& m : model.value("merges", Json::array())) {
    if (m.is_string()) {
      merges.push_back(splitMerge(path, m.get<std::string>(), merges.size() + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      COHORT_THROW(InvalidArgument) << path << ": merge " << merges.size() + 1 << " is " << m.dump()
                                    << ", not \"a b\" or [\"a\", \"b\"]";
    }
  }
  checkMerges(path, merges, v);
  for (const Json& added : json.value("added_tokens", Json::array())) {
    if (!added.value("special", false)) continue;
    const int64_t id = added.value("id", int64_t{-1});
    if (id < 0 || id >= static_cast<int64_t>(v.tokens.size())) {
      COHORT_THROW(InvalidArgument) << path << ": added token " << added.dump() << " has an id outside the vocabulary";
    }
    v.tokens[static_cast<size_t>(id)] = added.value("content", std::string());
    if (std::find(v.specialIds.begin(), v.specialIds.end(), id) == v.specialIds.end()) v.specialIds.push_back(id);
  }
  return v;
}

Vocabulary readVocabJson(const std::string& path, const Json& json) {
  Vocabulary v = emptyVocabulary("vocab.json", path);
  takeVocab(path, json, v);
  const std::string mergesPath = (fs::path(path).parent_path() / "merges.txt").string();
  if (!fs::exists(mergesPath)) COHORT_THROW(InvalidArgument) << path << ": no merges.txt beside it (" << mergesPath << ")";
  std::ifstream in(mergesPath);
  if (!in) COHORT_THROW(IoError) << mergesPath << ": cannot open: " << std::strerror(errno);
  std::vector<std::pair<std::string, std::string>> merges;
  size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    merges.push_back(splitMerge(mergesPath, line, number));
  }
  if (in.bad()) COHORT_THROW(IoError) << mergesPath << ": read failed";
  checkMerges(mergesPath, merges, v);
  return v;
}

// RFC 4648 base64 with padding; false for anything else.
bool decodeBase64(std::string_view text, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
    uint32_t word = 0;
    for (int k = 0; k < 4; ++k) {
      const int v = k >= 4 - pad ? 0 : value(text[i + k]);
      if (v < 0) return false;
      word = word << 6 | static_cast<uint32_t>(v);
    }
    for (int k = 0; k < 3 - pad; ++k) out += static_cast<char>(word >> (16 - 8 * k) & 0xFF);
  }
  return true;
}

Vocabulary readTiktoken(const std::string& path, const std::string& bytes) {
  Vocabulary v = emptyVocabulary("tiktoken", path);
  std::vector<bool> seen;
  std::string token;
  size_t number = 0;
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find('\n', at);
    if (end == std::string::npos) end = bytes.size();
    const std::string_view line = std::string_view(bytes).substr(at, end - at);
    at = end + 1;
    ++number;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    char* rankEnd = nullptr;
    const std::string rankText(space == line.npos ? std::string_view() : line.substr(space + 1));
    const unsigned long long rank = std::strtoull(rankText.c_str(), &rankEnd, 10);
    if (space == line.npos || !decodeBase64(line.substr(0, space), token) || rankText.empty() ||
        *rankEnd != '\0' || rankText[0] == '-' || rank >= (1ull << 31)) {
      if (v.tokens.empty()) COHORT_THROW(InvalidArgument) << path << ": " << kNotATokenizer;
      COHORT_THROW(InvalidArgument) << path << ": line " << number << " is not \"<base64 bytes> <rank>\"";
    }
    if (rank >= v.tokens.size()) v.tokens.resize(rank + 1), seen.resize(rank + 1, false);
    if (seen[rank]) COHORT_THROW(InvalidArgument) << path << ": rank " << rank << " is given twice (line " << number << ")";
    seen[rank] = true;
    v.tokens[rank] = token;
  }
  for (size_t r = 0; r < seen.size(); ++r) {
    if (!seen[r]) COHORT_THROW(InvalidArgument) << path << ": no token has rank " << r << " of 0.." << seen.size() - 1;
  }
  if (v.tokens.empty()) COHORT_THROW(InvalidArgument) << path << ": " << kNotATokenizer;
  v.eotId = static_cast<int64_t>(v.tokens.size());
  v.specialIds.push_back(v.eotId);
  v.tokens.push_back(kEndOfText);
  return v;
}

Vocabulary readFile(const std::string& path) {
  const std::string bytes = readBytes(path);
  uint32_t magic = 0;
  if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), 4);
  if (magic == kLlmcMagic) return readLlmc(path, bytes);
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') {
    const Json json = parseJson(path, bytes);
    return json.contains("model") && json["model"].is_object() ? readTokenizerJson(path, json) : readVocabJson(path, json);
  }
  return readTiktoken(path, bytes);
}

std::string findInDirectory(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "vocab.json", "gpt2_tokenizer.bin"}) {
    if (fs::exists(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  }
  std::vector<std::string> tiktoken;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".tiktoken") tiktoken.push_back(entry.path().string());
  }
  if (error) COHORT_THROW(IoError) << dir << ": cannot list: " << error.message();
  if (tiktoken.size() == 1) return tiktoken[0];
  COHORT_THROW(InvalidArgument) << dir << ": "
                                << (tiktoken.empty() ? "holds no tokenizer" : "holds more than one .tiktoken file")
                                << " (looked for tokenizer.json, vocab.json + merges.txt, gpt2_tokenizer.bin, one *.tiktoken)";
}

}  // namespace

Vocabulary readVocabulary(const std::string& pathOrDir) {
  Vocabulary v = readFile(fs::is_directory(pathOrDir) ? findInDirectory(pathOrDir) : pathOrDir);
  for (const int64_t id : v.specialIds) {
    if (v.tokens[static_cast<size_t>(id)] == kEndOfText) v.eotId = id;
  }
  if (v.eotId >= 0 && std::find(v.specialIds.begin(), v.specialIds.end(), v.eotId) == v.specialIds.end()) {
    v.specialIds.push_back(v.eotId);
  }
  return v;
}

std::string gpt2ByteToChar(unsigned char byte) {
  const uint32_t cp = byteCodePoint(byte);
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
}

}  // namespace cohort::nn
