// Token-shard datasets for language models (issue 32): `--data tokens:PATTERN` (llm.c's shards) and
// `tokens:raw:PATTERN` (headerless uint16 tokens, nanoGPT's), token_shards.h, read on demand: nothing
// of a shard is read until a batch asks for its windows, so a corpus of any size costs the windows
// it reads.
//
// A sample is a window of context + 1 consecutive tokens inside one shard (windows never cross a
// shard's end, as in llm.c's loader): inputs [context] its first context tokens, targets [context]
// the same shifted by one, both as whole-number floats; numClasses() is the model's vocabulary,
// and every id of a window is checked against it as the window is read (none where it is 65536 or
// more): a bad id is named by shard and position, even one written after the shards were opened.
//   train: about one pass over the tokens per epoch, Σ_shards (count − 1) / context windows, window
//          w at start position mix(seed, w) mod (the shards' Σ (count − context) start positions):
//          the same seed gives the same windows in any process, on any rank and after a resume,
//          and the loader shuffles and shards them by rank like every dataset.
//   test:  every shard's consecutive windows that do not overlap, from its start: every token but
//          the last partial window's is predicted once, the same for every seed.
// Errors: those of TokenShards::open, and InvalidArgument for a shard shorter than one window of
// context + 1 tokens (naming it) or context < 1; read() throws those of TokenShards::read (a bad id,
// a shard that shrank while being read).
// Ownership: returns a new Dataset the caller owns, which keeps the shards open. Thread safety:
// the dataset's read() may run on any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/data/dataset.h"
#include "runtime/data/token_shards.h"

namespace cohort::runtime::data {

struct TokenOptions {
  std::string pattern = {};  // a file or a glob over shards
  ShardLayout layout = ShardLayout::kLlmc;
  int64_t context = 0;     // tokens per sample (the model's T)
  int64_t vocabulary = 0;  // the model's: every id must be below it
  uint64_t seed = 0;       // the train windows' offsets
};

std::unique_ptr<Dataset> openTokens(const TokenOptions& options, Split split);

}  // namespace cohort::runtime::data
