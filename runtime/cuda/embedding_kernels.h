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
//   ensureShape(scratch, Shape{embeddingBackwardScratchWords(n, v)}, gpu.allocator());  // 4-byte words
//   embeddingBackward({.ids = ids, .n = n, .vocab = v, .dim = d, .gradOut = dy, .gradWeight = dw,
//                      .scratch = reinterpret_cast<uint32_t*>(scratch.data())}, stream);
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
  // embeddingBackwardScratchWords(n, vocab) words of device memory, owned by the caller, not
  // touched by it until the stream has run backward (nothing is allocated here)
  uint32_t* scratch = nullptr;
};

// The 4-byte words of scratch embeddingBackward needs: vocab + 1 + n + ⌈vocab/256⌉ + tiles·vocab,
// where the tiles' table is capped near 2²¹ words (a vocabulary of more than 2²¹ ids gets one tile).
int64_t embeddingBackwardScratchWords(int64_t n, int64_t vocab);

// out[i, :] = weight[ids[i], :]; a bad id's row is NaN and adds 1 to *badCount. One grid-stride
// pass over n·dim elements, float4 when dim is a multiple of 4 and the buffers are 16-byte aligned.
void embeddingForward(const EmbeddingArgs& args, const Stream& stream);

// gradWeight[ids[i], :] += gradOut[i, :] for every good position i, added in increasing i (bad
// ids are skipped); without `accumulate` each element starts from 0, so rows of absent ids are 0.
// No floating-point atomics: the same bits on every run, and the CPU's (nn::Embedding). Needs
// n < 2³¹ and vocab < 2³¹. A stable counting sort of the positions by id, then one sum per element:
//   1. count: positions are cut into tiles (one chunk of 256 positions each, or several when the
//      [tiles, vocab] table would pass its cap); block b counts tile b's ids into row b of the table
//      (integer atomics: the counts do not depend on the order).
//   2. scan: down each id's column, the table becomes "positions of this id in earlier tiles" and
//      the column's total the id's count; a scan of the counts over the vocabulary (blocks of 256
//      ids: a block's base is the sum of the earlier blocks' counts) gives offsets[id], and
//      offsets[vocab] = good positions.
//   3. place: block b walks tile b a chunk at a time; position i with row r goes to
//      sorted[offsets[r] + table[b, r] + (positions of r earlier in its chunk)], and table[b, r]
//      then grows by the chunk's count of r: each id's run lists its positions in increasing order.
//   4. sum: one thread per element (four columns with float4 when dim % 4 == 0 and the buffers are
//      16-byte aligned) adds its row's run in order, from 0 or, accumulating, from the element.
// Work: O(n + tiles·vocab + (vocab/256)²/2) integers for 1-3 (plus up to 256 comparisons per
// position), and the n·dim reads and vocab·dim writes of 4. Five kernels, all on `stream`. Positions sharing one id are summed one after another by
// one thread per column: a batch dominated by one id is as serial on the GPU as on the CPU.
void embeddingBackward(const EmbeddingArgs& args, const Stream& stream);

}  // namespace cohort::runtime::cuda
