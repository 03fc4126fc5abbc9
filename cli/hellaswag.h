// HellaSwag, zero-shot (issue 47, item 9): `cohort eval --task hellaswag FILE.jsonl` scores a GPT on
// HellaSwag's published jsonl as llm.c's dev/data/hellaswag.py does.
//
// Each line of the file is one item, a JSON object with at least
//   "ctx":     the context (text),
//   "endings": an array of 4 strings, the candidate continuations,
//   "label":   0..3, the index of the true ending
// (HellaSwag's other fields, "ind", "activity_label", "ctx_a", ..., are ignored). An item's rows are
// encode(ctx) followed by encode(" " + ending), one row per ending (render_example's tokens: encode is
// the tokenizer's ordinary encoding, or the bytes for a byte-level model without one). Each ending is
// scored by the cross-entropy of its tokens given what precedes them in its row, summed (the loss
// over the logits of the model's vocabulary, or of the tokenizer's ids when the vocabulary is padded
// past them); the item counts for acc when the ending of the least summed loss is the label, and for
// acc_norm when the ending of the least mean loss (the sum over the ending's scored tokens) is; a tie
// goes to the first ending, as torch's argmin.
// A row longer than the model's context + 1 tokens (its input is all but its last token) is cropped
// from the left: the context loses its first tokens, the ending is kept whole (llm.c's files never
// need it: GPT-2's 1024 tokens hold every HellaSwag item). An ending longer than the context itself
// is refused, naming the file, the line and both lengths.
//
// Errors (InvalidArgument, exit 2, one line "FILE:LINE: <problem>"): a line that is not JSON or not an
// object, a missing or mistyped "ctx", "endings" or "label", endings that are not 4 strings, a label
// outside 0..3, an ending past the context; a file with no item. IoError for an unreadable file.
// Thread safety: none shared; scoreHellaSwag runs the model on the calling thread (the CPU).
//
//   std::vector<HellaSwagItem> items = readHellaSwag(path, encode);
//   HellaSwagCounts c = scoreHellaSwag(model, items, {.path = path});  // c.correct / c.items: acc
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nn/model.h"

namespace cohort::cli {

inline constexpr int kHellaSwagEndings = 4;

struct HellaSwagItem {
  int64_t line = 0;                           // in the file, from 1
  int label = 0;                              // 0..3
  std::vector<int32_t> context;               // encode(ctx)
  std::vector<std::vector<int32_t>> endings;  // encode(" " + ending), kHellaSwagEndings of them
};

using Encode = std::function<std::vector<int32_t>(std::string_view text)>;

// Every item of the jsonl file at `path` (empty lines skipped), encoded with `encode`.
std::vector<HellaSwagItem> readHellaSwag(const std::string& path, const Encode& encode);

struct HellaSwagCounts {
  int64_t items = 0;
  int64_t correct = 0;      // acc's: the least summed loss is the label's
  int64_t correctNorm = 0;  // acc_norm's: the least mean loss per token is the label's
};

struct HellaSwagOptions {
  std::string path;         // the file, named in refusals
  int64_t scoredVocab = 0;  // the logits the softmax spans: the first N (0: all of the model's)
};

// InvalidArgument ("FILE:LINE: …") for an item `model` cannot score: an ending longer than its
// context, a token past options.scoredVocab, an ending left with no token to score; or for a model
// that is no gpt:. Cheap (no forward pass): call it on every item before a share of them is scored,
// so that every rank refuses the same file alike.
void checkHellaSwag(const nn::Model& model, std::span<const HellaSwagItem> items, const HellaSwagOptions& options);

// Scores `items` (checked by checkHellaSwag) with `model`, a gpt: model bound on the CPU.
HellaSwagCounts scoreHellaSwag(nn::Model& model, std::span<const HellaSwagItem> items, const HellaSwagOptions& options);

}  // namespace cohort::cli
