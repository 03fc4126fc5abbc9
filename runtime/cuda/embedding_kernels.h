// CUDA kernels of nn::Embedding: the row gather of forward and the deterministic scatter-add of
// backward, over raw device pointers (kernels.h's conventions: float32, row-major, contiguous,
// device memory on the stream's device, alive until the stream has run the kernels; each call
// enqueues on `stream` and returns without waiting; empty work enqueues nothing; launch errors
// throw cohort::Error). An id is good when it is a whole number in [0, vocab) stored as a float.
// Thread safety: no state; ordering is the stream's. Only built when CUDA is compiled in.
//
//   fill({counter, 1}, 0.0f, stream);   // the bad-id count forward adds to (0.0f has 0u's bits)
//   embeddingForward({.ids = ids, .n = n, .vocab = v, .dim = d, .weight = w, .out = y,
//                     .badCount = reinterpret_cast<uint32_t*>(counter)}, stream);
//   embeddingBackward({.ids = ids, .n = n, .vocab = v, .dim = d, .gradOut = dy, .gradWeight = dw}, stream);
#pragma once

#include <cstdint>

#include "runtime/stream.h"

namespace cohort::runtime::cuda {

struct EmbeddingArgs {
  const float* ids = nullptr;  // [n] token ids
  int64_t n = 0, vocab = 0, dim = 0;
  // forward
  const float* weight = nullptr;  // the table [vocab, dim]
  float* out = nullptr;           // [n, dim]
  uint32_t* badCount = nullptr;   // one counter in device memory, zeroed by the caller
  // backward
  const float* gradOut = nullptr;  // d(loss)/d(out) [n, dim]
  float* gradWeight = nullptr;     // d(loss)/d(weight) [vocab, dim]
  bool accumulate = false;         // add to gradWeight instead of overwriting it
};

// out[i, :] = weight[ids[i], :]; a bad id's row is NaN and adds 1 to *badCount. One grid-stride
// pass over n·dim elements, float4 when dim is a multiple of 4 and the buffers are 16-byte aligned.
void embeddingForward(const EmbeddingArgs& args, const Stream& stream);

// gradWeight[ids[i], :] += gradOut[i, :] for every good position i, added in increasing i (bad
// ids are skipped); without `accumulate` gradWeight is zeroed first, so rows of absent ids are 0.
// Each block owns a contiguous range of vocabulary rows and is the only writer of them: it reads
// every id (in tiles of one per thread), lists the positions in its range in increasing order
// (a block-wide prefix sum of the matches) and adds their rows, one thread per column. No
// atomics, so the result has the same bits on every run, and the CPU's (nn::Embedding).
void embeddingBackward(const EmbeddingArgs& args, const Stream& stream);

}  // namespace cohort::runtime::cuda
