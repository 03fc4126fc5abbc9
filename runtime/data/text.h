// Text datasets for language models (issue 20): `--data text:FILE`, byte-level tokens.
//
// Every byte of FILE is a token (vocabulary 256, numClasses() = 256). The first 90% of the file is
// the train split, the last 10% (at least context + 1 bytes) the test split. A sample is a window of
// context + 1 consecutive bytes: inputs [context] are its first context bytes, targets [context]
// the same shifted by one (the next byte at every position), both as whole-number floats.
//   train: floor((trainBytes − 1) / context) windows (about one pass over the split per epoch) at
//          offsets drawn uniformly from the split with runtime::Rng(seed): the same seed gives the
//          same windows, so a resumed run sees the samples it would have; the loader shuffles and
//          shards them by rank like every dataset.
//   test:  consecutive windows that do not overlap, from the start of the split: every test byte
//          is predicted once (up to the last partial window), the same for every seed.
// The windows are materialised: a split of n bytes holds about 8·n bytes of floats.
// Errors: IoError when FILE cannot be read, InvalidArgument when it is too short for a window of
// context + 1 bytes in each split (naming the sizes) or context < 1.
// Ownership: returns a new Dataset the caller owns. Thread safety: a pure function of its arguments.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/data/dataset.h"

namespace cohort::runtime::data {

struct TextOptions {
  std::string path;
  int64_t context = 0;  // tokens per sample (the model's T)
  uint64_t seed = 0;    // the train windows' offsets
};

std::unique_ptr<Dataset> readText(const TextOptions& options, Split split);

// The same from bytes already in memory; `name` stands for the file in messages and the name.
std::unique_ptr<Dataset> textDataset(const std::string& bytes, const std::string& name, const TextOptions& options,
                                     Split split);

}  // namespace cohort::runtime::data
