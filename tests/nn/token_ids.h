// Random token ids for the GPT tests, on the CPU and on a GPU: a [rows, time] tensor of ids below
// `vocab` (as floats, the embedding's input), the same for the same seed.
#pragma once

#include <cstdint>

#include "runtime/random.h"
#include "runtime/tensor.h"

namespace cohort::testing {

inline runtime::Tensor randomTokenIds(int64_t rows, int64_t time, int64_t vocab, uint64_t seed) {
  runtime::Rng rng(seed);
  runtime::Tensor t = runtime::Tensor::zeros(runtime::Shape{rows, time});
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = static_cast<float>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

}  // namespace cohort::testing
