#include "nn/gpt2_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "runtime/error.h"

namespace cohort::nn {

namespace {

// Unicode's White_Space property (PropList.txt), which Rust's regex (tiktoken) means by \s.
#define COHORT_WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr char kPattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" COHORT_WS "\\p{L}\\p{N}]+|[" COHORT_WS "]+(?![^" COHORT_WS
    "])|[" COHORT_WS "]+";
#undef COHORT_WS

// Lookahead over a long run of spaces backtracks one character at a time without recursion, so a
// small JIT stack is enough; 1 MiB leaves room for any alternative's nesting.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 1024 * 1024;

}  // namespace

struct Gpt2Pattern::Code {
  pcre2_code* code = nullptr;
};

Gpt2Pattern::Gpt2Pattern() : code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  COHORT_CHECK(code_->code != nullptr) << "GPT-2's pattern does not compile: PCRE2 error " << error << " at " << offset;
  const int jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
  COHORT_CHECK(jit == 0) << "PCRE2 cannot JIT-compile GPT-2's pattern: error " << jit;
}

Gpt2Pattern::~Gpt2Pattern() { pcre2_code_free(code_->code); }

struct PieceCursor::State {
  const pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  std::string_view text;
  size_t at = 0;
  // A match found past `at` (invalid bytes before it), to return after those bytes.
  size_t pendingStart = 0, pendingEnd = 0;
  bool pending = false;

  ~State() {
    pcre2_match_data_free(match);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

PieceCursor::PieceCursor(const Gpt2Pattern& pattern) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.code = pattern.code_->code;
  s.match = pcre2_match_data_create_from_pattern(s.code, nullptr);
  s.context = pcre2_match_context_create(nullptr);
  s.stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
  if (s.match == nullptr || s.context == nullptr || s.stack == nullptr) throw std::bad_alloc();
  pcre2_jit_stack_assign(s.context, nullptr, s.stack);
}

PieceCursor::~PieceCursor() = default;
PieceCursor::PieceCursor(PieceCursor&&) noexcept = default;
PieceCursor& PieceCursor::operator=(PieceCursor&&) noexcept = default;

void PieceCursor::reset(std::string_view text) {
  state_->text = text;
  state_->at = 0;
  state_->pending = false;
}

bool PieceCursor::next(std::string_view& piece, bool& valid) {
  State& s = *state_;
  if (s.at >= s.text.size()) return false;
  if (!s.pending) {
    const int rc = pcre2_jit_match(s.code, reinterpret_cast<PCRE2_SPTR>(s.text.data()), s.text.size(), s.at, 0,
                                   s.match, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      s.pendingStart = s.pendingEnd = s.text.size();  // the rest is bytes that are not UTF-8
    } else {
      COHORT_CHECK(rc > 0) << "PCRE2 failed on GPT-2's pattern at byte " << s.at << ": error " << rc;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.match);
      s.pendingStart = ovector[0];
      s.pendingEnd = ovector[1];
      COHORT_CHECK(s.pendingEnd > s.pendingStart) << "empty match at byte " << s.pendingStart;
    }
    s.pending = true;
  }
  if (s.pendingStart > s.at) {  // bytes no alternative matches: not UTF-8
    piece = s.text.substr(s.at, s.pendingStart - s.at);
    valid = false;
    s.at = s.pendingStart;
    return true;
  }
  piece = s.text.substr(s.pendingStart, s.pendingEnd - s.pendingStart);
  valid = true;
  s.at = s.pendingEnd;
  s.pending = false;
  return true;
}

}  // namespace cohort::nn
