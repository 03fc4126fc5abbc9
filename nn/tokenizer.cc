#include "nn/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "nn/bpe.h"           // BpeRanks: the merges by rank
#include "nn/gpt2_pattern.h"  // Gpt2Pattern, PieceCursor: the pre-tokenisation
#include "runtime/error.h"

namespace cohort::nn {

struct Tokenizer::State {
  Vocabulary vocabulary;
  BpeRanks ranks;
  std::string cannotEncode;  // why the vocabulary is not a byte-level BPE; empty when it is
  Gpt2Pattern pattern;
  std::string digest;
};

struct Tokenizer::Encoder::Work {
  explicit Work(const Gpt2Pattern& pattern) : cursor(pattern) {}
  PieceCursor cursor;
  BpeScratch scratch;
};

namespace {

// FNV-1a 64 over each token's length (4 bytes, little-endian), bytes and special mark, then the
// end-of-text id.
std::string digestOf(const Vocabulary& v) {
  uint64_t h = 0xCBF29CE484222325ull;
  auto add = [&h](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 0x100000001B3ull;
  };
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const uint32_t length = static_cast<uint32_t>(v.tokens[id].size());
    const uint8_t special =
        std::find(v.specialIds.begin(), v.specialIds.end(), static_cast<int64_t>(id)) != v.specialIds.end();
    add(&length, sizeof(length));
    add(v.tokens[id].data(), length);
    add(&special, 1);
  }
  add(&v.eotId, sizeof(v.eotId));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace

Tokenizer Tokenizer::read(const std::string& pathOrDir) { return fromVocabulary(readVocabulary(pathOrDir)); }

Tokenizer Tokenizer::fromVocabulary(Vocabulary vocabulary) {
  auto state = std::make_shared<State>();
  std::vector<std::string> ranked = vocabulary.tokens;
  for (const int64_t id : vocabulary.specialIds) ranked[static_cast<size_t>(id)].clear();  // never merged to
  try {
    state->ranks = BpeRanks(ranked);
  } catch (const InvalidArgument& e) {
    state->cannotEncode = (vocabulary.path.empty() ? "vocabulary" : vocabulary.path) + ": cannot encode: " + e.what();
  }
  state->digest = digestOf(vocabulary);
  state->vocabulary = std::move(vocabulary);
  Tokenizer t;
  t.state_ = std::move(state);
  return t;
}

int64_t Tokenizer::size() const { return state_ ? static_cast<int64_t>(state_->vocabulary.tokens.size()) : 0; }
int64_t Tokenizer::eotId() const { return state_ ? state_->vocabulary.eotId : -1; }
const std::string& Tokenizer::digest() const { return state_->digest; }
const Vocabulary& Tokenizer::vocabulary() const { return state_->vocabulary; }

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encoder().encode(text, out);
  return out;
}

std::vector<int32_t> Tokenizer::encodeWithSpecial(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encoder().encodeWithSpecial(text, out);
  return out;
}

std::string Tokenizer::decode(int64_t id) const {
  if (id >= 0 && id < size()) return state_->vocabulary.tokens[static_cast<size_t>(id)];
  return "<|" + std::to_string(id) + "|>";
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    if (id >= 0 && id < size()) {
      text += state_->vocabulary.tokens[static_cast<size_t>(id)];
    } else {
      text += decode(id);
    }
  }
  return text;
}

Tokenizer::Encoder Tokenizer::encoder() const {
  COHORT_CHECK(state_ != nullptr) << "encoding with an empty Tokenizer";
  if (!state_->cannotEncode.empty()) COHORT_THROW(InvalidArgument) << state_->cannotEncode;
  return Encoder(state_);
}

Tokenizer::Encoder::Encoder(std::shared_ptr<const State> state)
    : state_(std::move(state)), work_(std::make_unique<Work>(state_->pattern)) {}
Tokenizer::Encoder::~Encoder() = default;
Tokenizer::Encoder::Encoder(Encoder&&) noexcept = default;
Tokenizer::Encoder& Tokenizer::Encoder::operator=(Encoder&&) noexcept = default;

void Tokenizer::Encoder::encode(std::string_view text, std::vector<int32_t>& out) {
  PieceCursor& cursor = work_->cursor;
  cursor.reset(text);
  for (std::string_view piece; cursor.next(piece);) state_->ranks.encodePiece(piece, out, work_->scratch);
}

// Each special token's text is its id; the text between is encoded as ordinary text. Of specials
// starting at the same byte, the longest wins.
void Tokenizer::Encoder::encodeWithSpecial(std::string_view text, std::vector<int32_t>& out) {
  const Vocabulary& v = state_->vocabulary;
  size_t at = 0;
  while (at <= text.size()) {
    size_t found = std::string_view::npos, length = 0;
    int64_t id = -1;
    for (const int64_t special : v.specialIds) {
      const std::string& s = v.tokens[static_cast<size_t>(special)];
      const size_t f = s.empty() ? std::string_view::npos : text.find(s, at);
      if (f < found || (f == found && f != std::string_view::npos && s.size() > length)) {
        found = f, length = s.size(), id = special;
      }
    }
    encode(text.substr(at, found == std::string_view::npos ? std::string_view::npos : found - at), out);
    if (found == std::string_view::npos) break;
    out.push_back(static_cast<int32_t>(id));
    at = found + length;
  }
}

}  // namespace cohort::nn
